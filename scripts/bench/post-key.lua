-- wrk script: as post.lua, every request with the one key in KEY (env): a caller slotgate knows.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "post.lua")
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("KEY") or "none")
