-- Take a slot of each concurrency limit for one holder, all or none. KEYS are the
-- limits' sorted sets (member: a holder; score: when its lease lapses, in seconds of
-- Redis's clock); ARGV[1] the holder, ARGV[2] the lease in seconds, ARGV[2 + i] the
-- limit of KEYS[i]. Holders whose lease lapsed are dropped first; a holder already
-- counted keeps its slot. Answers 1 when taken (every lease set), 0 when a limit is
-- reached (nothing taken).
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  redis.call('zremrangebyscore', key, '-inf', string.format('%.6f', now))
  if not redis.call('zscore', key, holder)
      and redis.call('zcard', key) >= tonumber(ARGV[i + 2]) then
    return 0
  end
end
local expiry = string.format('%.6f', now + lease)
-- The set outlives its last lease by an hour: a key of many (a tenant's) is forgotten.
local keep = math.ceil((lease + 3600) * 1000)
for _, key in ipairs(KEYS) do
  redis.call('zadd', key, expiry, holder)
  redis.call('pexpire', key, keep)
end
return 1
