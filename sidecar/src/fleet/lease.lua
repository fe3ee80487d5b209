-- One fleet token bucket, moved atomically: refilled by the store's own clock, then what the caller
-- settles added (tokens it hands back, refunds; negative: debt it charges), capped at capacity, then
-- up to `want` tokens granted as the caller's lease. The level may go below zero (debt): nothing is
-- granted until it has refilled above zero.
--
-- KEYS[1]  the bucket (a hash: level, ts in milliseconds of the store's clock)
-- ARGV[1]  capacity (tokens)
-- ARGV[2]  refill (tokens per second; 0: a fixed quota)
-- ARGV[3]  want (tokens, >= 0)
-- ARGV[4]  settle (tokens, either sign)
-- ARGV[5]  the sidecar's id
-- ARGV[6]  the sidecar's sequence number of this sync, for this bucket
-- ARGV[7]  with no refill: when the bucket may go, in Unix milliseconds (a calendar quota's window,
--          after its end); 0: it stays
-- KEYS[2]  a calendar quota's window only: the fleet's operator limits (a hash), and ARGV[8] this
--          quota's field in it. An operator's limit there replaces the capacity the caller passed,
--          for every sidecar at once; the bucket keeps both ('pc': the policy's, 'cap': in force)
--          for limit.lua.
-- Returns  {granted, level}, as strings: Lua numbers are doubles, and Redis would truncate them.
--
-- A sync is applied once: a sidecar that lost the answer (a timeout) sends the same sync again with
-- the same sequence number, and gets the answer of the first, nothing applied twice.
local capacity = tonumber(ARGV[1])
local refill = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local settle = tonumber(ARGV[4])
local seq_field = 's:' .. ARGV[5]
local reply_field = 'r:' .. ARGV[5]
local done = redis.call('HMGET', KEYS[1], seq_field, reply_field)
if done[1] == ARGV[6] and done[2] then
  local sep = string.find(done[2], ' ', 1, true)
  return {string.sub(done[2], 1, sep - 1), string.sub(done[2], sep + 1)}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pc = capacity
if KEYS[2] then
  local op = tonumber(redis.call('HGET', KEYS[2], ARGV[8]) or '')
  if op then capacity = op end
end
local state = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level = tonumber(state[1])
local ts = tonumber(state[2])
if level == nil or ts == nil then
  level = capacity
  ts = now
end
if now > ts then
  level = level + (now - ts) / 1000 * refill
end
if level > capacity then level = capacity end
level = level + settle
if level > capacity then level = capacity end
local granted = 0
if want > 0 and level > 0 then
  granted = math.min(want, level)
end
level = level - granted
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now),
  seq_field, ARGV[6], reply_field, tostring(granted) .. ' ' .. tostring(level))
if KEYS[2] then
  redis.call('HSET', KEYS[1], 'pc', tostring(pc), 'cap', tostring(capacity))
end
-- A bucket that would be full again anyway may go: it comes back full. A fixed quota stays.
if refill > 0 then
  local full_in_ms = math.ceil((capacity - level) / refill * 1000)
  redis.call('PEXPIRE', KEYS[1], full_in_ms + 60000)
elseif tonumber(ARGV[7] or '0') > 0 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[7])
else
  redis.call('PERSIST', KEYS[1])
end
return {tostring(granted), tostring(level)}
