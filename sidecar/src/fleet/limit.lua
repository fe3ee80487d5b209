-- An operator's limit for one calendar quota, for the whole fleet: set (or, with an empty ARGV[2],
-- removed) in the fleet's limits hash, which every sidecar's lease syncs read (lease.lua); and the
-- current window's bucket moved with it at once: what was used stays used, so what is left grows
-- or shrinks by the difference between the limit in force before ('cap') and after (the new one,
-- or the policy's, 'pc', once removed).
--
-- KEYS[1]  the fleet's operator limits (a hash)
-- KEYS[2]  the quota's current window (a fleet bucket, as lease.lua keeps it)
-- ARGV[1]  the quota's field in the limits hash
-- ARGV[2]  the new limit, or '' to remove it
-- Returns  what is left in the window after, as a string; '' when no sidecar has used it yet (it
--          starts whole at the limit in force).
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local s = redis.call('HMGET', KEYS[2], 'level', 'cap', 'pc')
local level, cap, pc = tonumber(s[1]), tonumber(s[2]), tonumber(s[3])
if level == nil or cap == nil then
  return ''
end
local new = tonumber(ARGV[2]) or pc or cap
level = level + (new - cap)
redis.call('HSET', KEYS[2], 'level', tostring(level), 'cap', tostring(new))
return tostring(level)
