-- wrk script: as post.lua, but every request's prompt is different, so slotgate cannot answer its
-- exact prompt count from its cache and asks the upstream's /apply-template and /tokenize each time
-- (with post.lua's one fixed body, only the first request is counted upstream).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "post.lua")
dofile(dir .. "thread-ids.lua")

local n = 0
local prefix = '{"model":"m","messages":[{"role":"user","content":"hello there '
function request()
  n = n + 1
  -- The time and thread make prompts unique across runs and threads, the counter within one.
  return wrk.format(nil, nil, nil,
    string.format('%s%d-%d-%d"}],"max_tokens":8}', prefix, os.time(), id or 0, n))
end
