-- The keys of admit.lua; ARGV: job ids held until now. Admits each while the bound
-- allows, whatever the stop flag; answers 1 (admitted or already counted) or 0 per id.
local maxsize = tonumber(redis.call('hget', KEYS[1], 'maxsize') or '0')
local answers = {}
for i, job_id in ipairs(ARGV) do
  if redis.call('sismember', KEYS[2], job_id) == 1 then
    answers[i] = 1
  elseif maxsize > 0 and redis.call('scard', KEYS[2]) >= maxsize then
    answers[i] = 0
  else
    redis.call('sadd', KEYS[2], job_id)
    answers[i] = 1
  end
end
return answers
