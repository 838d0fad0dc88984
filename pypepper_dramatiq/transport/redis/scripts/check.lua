-- The keys of admit.lua, no change: what it would answer a new job now.
if redis.call('hget', KEYS[1], 'stopped') == '1' then return 'stopped' end
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
if maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then return 'full' end
return 'ok'
