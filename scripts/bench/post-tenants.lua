-- wrk script: as post.lua, but each request carries one of TENANTS API keys (env, default 1000),
-- in turn per thread, so slotgate keeps a budget and ledger row for each (`quota.sh`).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "post.lua")
dofile(dir .. "thread-ids.lua")

local tenants = tonumber(os.getenv("TENANTS") or "1000")
local n = 0
function request()
  n = n + 1
  local key = string.format("key-%d", ((id or 1) * 7919 + n) % tenants)
  return wrk.format(nil, nil, {["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json"}, nil)
end
