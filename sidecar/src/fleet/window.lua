-- One fleet sliding window: a count per time slot (the window's tenth), the slots older than the
-- window dropped, the total of the rest returned. A sidecar pushes what it added since its last
-- push; each push is applied once (the sidecar's id and a sequence number, as lease.lua).
--
-- KEYS[1]  the window (a hash: slot index -> count; s:<id>, r:<id> for the pushes applied)
-- ARGV[1]  the window, milliseconds
-- ARGV[2]  the amount to add now (either sign; 0 only reads)
-- ARGV[3]  the sidecar's id
-- ARGV[4]  its sequence number of this push, for this window
-- Returns  the total over the window, a string.
local window = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local seq_field = 's:' .. ARGV[3]
local reply_field = 'r:' .. ARGV[3]
local done = redis.call('HMGET', KEYS[1], seq_field, reply_field)
if done[1] == ARGV[4] and done[2] then
  return done[2]
end
local slot = math.max(math.floor(window / 10), 1)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx = math.floor(now / slot)
if amount ~= 0 then
  redis.call('HINCRBY', KEYS[1], tostring(idx), amount)
end
local oldest = idx - math.ceil(window / slot) + 1
local fields = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #fields, 2 do
  local n = tonumber(fields[i])
  if n ~= nil then
    if n < oldest then
      redis.call('HDEL', KEYS[1], fields[i])
    else
      total = total + tonumber(fields[i + 1])
    end
  end
end
redis.call('HSET', KEYS[1], seq_field, ARGV[4], reply_field, tostring(total))
redis.call('PEXPIRE', KEYS[1], window + 2 * slot + 60000)
return tostring(total)
