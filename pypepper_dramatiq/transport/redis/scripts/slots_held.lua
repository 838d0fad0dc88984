-- The holders of KEYS[1]'s concurrency slots whose lease has not lapsed (Redis's clock).
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('zrangebyscore', KEYS[1], string.format('(%.6f', now), '+inf')
