# The agentmesh daemon as an image without any base image: a static binary, a numeric user and a
# writable /data. simulations/build-image.sh builds the binary and prepares the build context
# (target/image/); build with that script rather than directly.
FROM scratch
COPY agentmesh /agentmesh
COPY cards /cards
COPY --chown=10001:10001 data /data
USER 10001:10001
ENV AGENTMESH_DATA_DIR=/data \
    AGENTMESH_HTTP=0.0.0.0:8080 \
    AGENTMESH_LISTEN=/ip4/0.0.0.0/tcp/4001 \
    AGENTMESH_LOG_FORMAT=json
EXPOSE 8080/tcp 4001/tcp
STOPSIGNAL SIGTERM
ENTRYPOINT ["/agentmesh"]
CMD ["run"]
