-- Take a slot of each concurrency limit for one holder, all or none. KEYS[1 .. n] are
-- the limits' sorted sets (member: a holder; score: when its lease lapses, in seconds
-- of Redis's clock); ARGV[1] the holder, ARGV[2] the lease in seconds, ARGV[3] n,
-- ARGV[3 + i] the limit of KEYS[i]. KEYS[n + 1 ..] are the hashes of the channels
-- whose limit is among them: each records its ARGV[3 + j] (field max_running, for
-- people: the limit a worker last applied). Holders whose lease lapsed are dropped
-- first; a holder already counted keeps its slot. Answers 1 when taken (every lease
-- set), 0 when a limit is reached (nothing taken).
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
for j = n + 1, #KEYS do
  redis.call('hset', KEYS[j], 'max_running', ARGV[3 + j])
end
for i = 1, n do
  local key = KEYS[i]
  redis.call('zremrangebyscore', key, '-inf', string.format('%.6f', now))
  if not redis.call('zscore', key, holder)
      and redis.call('zcard', key) >= tonumber(ARGV[i + 3]) then
    return 0
  end
end
local expiry = string.format('%.6f', now + lease)
-- The set outlives its last lease by an hour: a key of many (a tenant's) is forgotten.
local keep = math.ceil((lease + 3600) * 1000)
for i = 1, n do
  redis.call('zadd', KEYS[i], expiry, holder)
  redis.call('pexpire', KEYS[i], keep)
end
return 1
