-- Shares one key slotgate issued with the fleet (docs/keys.md#a-fleet-shares-its-keys).
-- KEYS[1]: the keys hash (id -> the key's record as JSON, digests only, never a secret)
-- KEYS[2]: the versions hash (id -> "<revoked 0|1> <rev>")
-- KEYS[3]: the keys' version counter, raised at each change so sidecars know to read again
-- ARGV[1]: id, ARGV[2]: record JSON, ARGV[3]: revoked (0 or 1), ARGV[4]: rev
-- The later copy wins: a revoked one over any that is not, else the higher rev. Returns 1 when
-- this copy was kept, 0 when the store's is as late or later.
local held = redis.call('HGET', KEYS[2], ARGV[1])
local revoked, rev = tonumber(ARGV[3]), tonumber(ARGV[4])
if held then
  local sp = string.find(held, ' ', 1, true)
  local hrevoked = tonumber(string.sub(held, 1, sp - 1))
  local hrev = tonumber(string.sub(held, sp + 1))
  if hrevoked > revoked or (hrevoked == revoked and hrev >= rev) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. ARGV[4])
redis.call('INCR', KEYS[3])
return 1
