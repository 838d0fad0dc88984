-- admit.lua and Dramatiq's enqueue in one step, for one or more jobs (of any channels).
-- KEYS holds four keys per (channel, queue) pair the jobs use, each pair once: the
-- channel's hash, its set of waiting job ids, the Dramatiq queue (a list of message
-- ids) and its message hash. Per job i, ARGV[4i-3] to ARGV[4i]: its pair's number
-- (1, 2...), the job id, the message's redis_message_id, the encoded message.
-- Answers one letter per job, in one string: 'o' (ok), 'f' (full) or 's'
-- (stopped), one bulk reply where an array of 100 answers cost the client a read
-- per answer (run_offers reads it); for each 'o' the job is counted
-- waiting and its message queued as the broker's own "enqueue" command does. A
-- channel's flag, bound and count are read once per call (nothing else runs
-- meanwhile), then counted here.
local answers, channels = {}, {}
for i = 1, #ARGV / 4 do
  local base = 4 * tonumber(ARGV[4 * i - 3])
  local meta, waiting, job_id = KEYS[base - 3], KEYS[base - 2], ARGV[4 * i - 2]
  local channel = channels[meta]
  if channel == nil then
    local found = redis.call('hmget', meta, 'stopped', 'maxsize')
    channel = {
      stopped = found[1] == '1',
      maxsize = tonumber(found[2] or '0'),
      size = redis.call('scard', waiting),
    }
    channels[meta] = channel
  end
  local answer = 'o'
  if channel.stopped then
    answer = 's'
  elseif redis.call('sismember', waiting, job_id) == 0 then
    if channel.maxsize > 0 and channel.size >= channel.maxsize then
      answer = 'f'
    else
      redis.call('sadd', waiting, job_id)
      channel.size = channel.size + 1
    end
  end
  if answer == 'o' then
    redis.call('hset', KEYS[base], ARGV[4 * i - 1], ARGV[4 * i])
    redis.call('rpush', KEYS[base - 1], ARGV[4 * i - 1])
  end
  answers[i] = answer
end
return table.concat(answers)
