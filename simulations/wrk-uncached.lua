-- Every request asks for a random page of 100 among the view's AGENTS agents (environment, default
-- 10,000): almost every query is new to the response cache (it holds far fewer pages than that), so
-- this measures the full query path.
local agents = tonumber(os.getenv("AGENTS") or "10000")
request = function()
  return wrk.format("GET", "/api/v1/discovery/capabilities?limit=100&offset=" .. math.random(0, agents - 101))
end
