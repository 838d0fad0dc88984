-- Renew concurrency slots: KEYS[i]'s holder ARGV[1 + i] gets a lease of ARGV[1]
-- seconds from now (Redis's clock), unless its lease lapsed already (its slot is not
-- taken again: another holder may have it). Answers how many were renewed.
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lease = tonumber(ARGV[1])
local expiry = string.format('%.6f', now + lease)
local keep = math.ceil((lease + 3600) * 1000)
local renewed = 0
for i, key in ipairs(KEYS) do
  local score = redis.call('zscore', key, ARGV[i + 1])
  if score and tonumber(score) > now then
    redis.call('zadd', key, expiry, ARGV[i + 1])
    redis.call('pexpire', key, keep)
    renewed = renewed + 1
  end
end
return renewed
