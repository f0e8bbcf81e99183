-- Every request asks for a random page of 100 among ~10,000: almost every query is new to the response
-- cache (it holds far fewer pages than that), so this measures the full query path.
request = function()
  return wrk.format("GET", "/api/v1/discovery/capabilities?limit=100&offset=" .. math.random(0, 9899))
end
