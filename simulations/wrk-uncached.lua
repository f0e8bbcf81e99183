-- Every request carries a distinct unknown parameter, which discovery ignores but which makes every
-- query string new to the response cache: this measures the uncached query path.
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/api/v1/discovery/capabilities?limit=100&nocache=" .. counter .. "-" .. math.random(1, 1000000000))
end
