-- KEYS[1]: the channel's hash. Sets the bound to ARGV[1] and answers the bound it
-- replaced (false when none was stored), in one step, so that the change logged is
-- the change made even when two processes resize at once.
local before = redis.call('hget', KEYS[1], 'maxsize')
redis.call('hset', KEYS[1], 'maxsize', ARGV[1])
return before
