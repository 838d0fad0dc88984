-- Admit one job to a channel unless it is stopped or full: 'ok', 'full' or 'stopped'.
-- KEYS[1]: the channel's hash (maxsize, stopped); KEYS[2]: its set of waiting job ids.
-- ARGV[1]: the job id (re-admitting it is 'ok', counted once).
if redis.call('hget', KEYS[1], 'stopped') == '1' then return 'stopped' end
if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then return 'ok' end
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
if maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then return 'full' end
redis.call('sadd', KEYS[2], ARGV[1])
return 'ok'
