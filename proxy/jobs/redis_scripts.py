"""The jobs' Redis queue's state changes, each one Lua script (atomic in Redis).

Keys, under a prefix P: `P:job:<id>` a hash per job; `P:stream` the stream workers read
with consumer group `workers` (an entry per attempt to run; a worker holds it in the group's
pending list while it runs, its idle time renewed by XCLAIM; one idle longer than the lease
is taken over by XAUTOCLAIM); `P:delayed` a sorted set of jobs waiting out their back-off;
`P:queued` (by creation) and `P:running` the unfinished jobs; `P:index` every kept job by
creation (the list); `P:ended:<status>` the ended jobs of each status by creation (the list
filtered by status, redis_pages.py); `P:expiry` ended jobs by when they go; `P:idem:<key>` a
key's job; `P:callbacks` the outbox: ended jobs whose callback waits for a try, by when.

No key of the queue has a TTL: an ended job keeps an `expires` field and goes in the sweep
(FORGET), with its idempotency key. Under `maxmemory-policy volatile-lru` (the shipped one,
for the caches sharing this Redis) a key with a TTL may be evicted, and was: jobs filling
Redis with their uploads evicted finished jobs, whose results were then gone, and their
idempotency keys, which would have let a retry make a second job.
Every script that moves a job on runs even when Redis is out of memory (`allow-oom`): each one
ends by dropping the job's upload, so refusing them would keep memory full for good. Only
SUBMIT is refused then (the door answers 503)."""

from __future__ import annotations

ALLOW_OOM = "#!lua flags=allow-oom\n"

# A group of submissions in one call (proxy/jobs/grouping.py: those arriving together).
# KEYS: queued, running, index, stream, bytes, then each job's own two: its hash and its
# idempotency key (or ""). ARGV: each job's five: id, max_queued, max_bytes (0: none), its
# fields as a JSON list of name, value strings, its upload. The fields in one argument:
# redis-py packs each argument in Python, and ~30 a job were a seventh of the proxy's time in
# an enqueue; one call a group, not a script call a job: the keys shared by the group are
# packed and sent once, and Redis runs one script. A key reused (also within the group): its
# job (or a conflict). `bytes` counts the unfinished jobs' uploads (taken off where one is
# dropped). Answers each job's {outcome, detail}, in order.
SUBMIT = """
local function submit(job, idem, id, max_queued, max_bytes, fields, upload)
  local listed = cjson.decode(fields)
  local field = {}
  for i = 1, #listed, 2 do field[listed[i]] = listed[i + 1] end
  if idem ~= '' then
    local known = redis.call('GET', idem)
    if known then
      local prefix = string.sub(job, 1, #job - #id)
      local stored = redis.call('HMGET', prefix .. known, 'pipeline', 'digest')
      if stored[1] then
        if stored[1] ~= field.pipeline or stored[2] ~= field.digest then
          return {'conflict', known}
        end
        return {'known', known}
      end
    end
  end
  local unfinished = redis.call('ZCARD', KEYS[1]) + redis.call('SCARD', KEYS[2])
  if unfinished >= tonumber(max_queued) then return {'full', unfinished .. ' unfinished jobs'} end
  local size = #upload
  local held = math.max(0, tonumber(redis.call('GET', KEYS[5]) or '0'))
  if tonumber(max_bytes) > 0 and held + size > tonumber(max_bytes) then
    return {'full', held .. ' bytes of uploads waiting, the limit ' .. max_bytes}
  end
  redis.call('INCRBY', KEYS[5], size)
  local created = tonumber(field.created)
  local entry = redis.call('XADD', KEYS[4], '*', 'id', id)
  -- One HSET for every field (a call per field was most of the script's calls).
  redis.call('HSET', job, 'entry', entry, 'payload', upload, unpack(listed))
  redis.call('ZADD', KEYS[1], created, id)
  redis.call('ZADD', KEYS[3], created, id)
  if idem ~= '' then
    redis.call('SET', idem, id)
    redis.call('HSET', job, 'idem', idem)
  end
  return {'new', id}
end
local answers = {}
for n = 0, #ARGV / 5 - 1 do
  local a = n * 5
  answers[n + 1] = submit(KEYS[6 + 2 * n], KEYS[7 + 2 * n], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
                          ARGV[a + 4], ARGV[a + 5])
end
return answers
"""

# KEYS: job, queued, running, stream, expiry, leases, ended:failed, bytes, callbacks; ARGV: id,
# entry, token, now, group, keep_ms, error, lease_ms, consumer, then the fields to answer (once
# taken). An entry this worker read, or a job whose lease ran out:
# run it (the entry now this consumer's), leave it (its lease still runs: its worker lives),
# drop it (its job ended, or it is an old attempt's), or fail the job (its worker died on
# its last attempt). A job already running under the token asked with is this worker's own
# take, sent again because its reply was lost: answered again, the attempt not counted twice.
TAKE = (
    ALLOW_OOM
    + """
local status, attempts, most, entry, created, token = unpack(redis.call('HMGET', KEYS[1],
                               'status', 'attempts', 'max_attempts', 'entry', 'created', 'token'))
local function drop()
  redis.call('XACK', KEYS[4], ARGV[5], ARGV[2])
  redis.call('XDEL', KEYS[4], ARGV[2])
end
if not status or (status ~= 'queued' and status ~= 'running') or entry ~= ARGV[2] then
  drop()
  return 'gone'
end
local now = tonumber(ARGV[4])
if status == 'running' and token == ARGV[3] then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[8]) / 1000, ARGV[1])
  return redis.call('HMGET', KEYS[1], unpack(ARGV, 10))
end
if status == 'running' then
  local lease = redis.call('ZSCORE', KEYS[6], ARGV[1])
  if lease and tonumber(lease) > now then return 'held' end
end
attempts = tonumber(attempts)
if status == 'running' and attempts >= tonumber(most) then
  drop()
  redis.call('HSET', KEYS[1], 'status', 'failed', 'updated', ARGV[4], 'finished', ARGV[4],
             'error', ARGV[7])
  redis.call('DECRBY', KEYS[8], redis.call('HSTRLEN', KEYS[1], 'payload'))
  redis.call('HDEL', KEYS[1], 'token', 'payload', 'entry')
  redis.call('HSET', KEYS[1], 'expires', now + tonumber(ARGV[6]) / 1000)
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('ZADD', KEYS[5], now + tonumber(ARGV[6]) / 1000, ARGV[1])
  redis.call('ZADD', KEYS[7], tonumber(created), ARGV[1])
  local callback = redis.call('HGET', KEYS[1], 'callback')
  -- Nobody sends its callback at once: the outbox's next look does.
  if callback and callback ~= '' then redis.call('ZADD', KEYS[9], now, ARGV[1]) end
  return 'exhausted'
end
redis.call('XCLAIM', KEYS[4], ARGV[5], ARGV[9], 0, ARGV[2], 'JUSTID')
redis.call('HSET', KEYS[1], 'status', 'running', 'token', ARGV[3], 'updated', ARGV[4],
           'attempts', attempts + 1)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[8]) / 1000, ARGV[1])
return redis.call('HMGET', KEYS[1], unpack(ARGV, 10))
"""
)

# KEYS: job, running, stream, expiry, queued, delayed, leases, ended:<status>, bytes, callbacks;
# ARGV: id, token ('' for a cancel), status, now, keep_ms, group, the callback's due (held for
# the writer), then fields to set as name, value pairs.
# The final state, written once: by the worker holding the token, or by a cancel. A worker's
# token stays (every other script reads the status first): the same worker's FINISH sent again
# (its first reply lost to a timeout, yet applied) is answered 1 again, so that the worker
# still calls the job's callback back (sqlite_sql.finish does the same).
FINISH = (
    ALLOW_OOM
    + """
local status, token, entry, created = unpack(redis.call('HMGET', KEYS[1], 'status', 'token',
                                                       'entry', 'created'))
if ARGV[2] ~= '' and token == ARGV[2] and status == ARGV[3] then return 1 end
if status ~= 'running' and not (ARGV[2] == '' and status == 'queued') then return 0 end
if ARGV[2] ~= '' and token ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'updated', ARGV[4], 'finished', ARGV[4],
           'expires', tonumber(ARGV[4]) + tonumber(ARGV[5]) / 1000, unpack(ARGV, 8))
local callback = redis.call('HGET', KEYS[1], 'callback')
if callback and callback ~= '' then redis.call('ZADD', KEYS[10], ARGV[7], ARGV[1]) end
redis.call('DECRBY', KEYS[9], redis.call('HSTRLEN', KEYS[1], 'payload'))
redis.call('HDEL', KEYS[1], 'payload', 'entry')
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], 'token') end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZADD', KEYS[4], tonumber(ARGV[4]) + tonumber(ARGV[5]) / 1000, ARGV[1])
redis.call('ZADD', KEYS[8], tonumber(created), ARGV[1])
if entry then
  redis.call('XACK', KEYS[3], ARGV[6], entry)
  redis.call('XDEL', KEYS[3], entry)
end
return 1
"""
)

# KEYS: job, running, queued, stream, delayed, leases; ARGV: id, token, now, due, error, group.
REQUEUE = (
    ALLOW_OOM
    + """
local status, token, entry, created = unpack(redis.call('HMGET', KEYS[1], 'status', 'token',
                                                       'entry', 'created'))
if status ~= 'running' or token ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'updated', ARGV[3], 'error', ARGV[5])
redis.call('HDEL', KEYS[1], 'token', 'entry')
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(created), ARGV[1])
if entry then
  redis.call('XACK', KEYS[4], ARGV[6], entry)
  redis.call('XDEL', KEYS[4], entry)
end
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
return 1
"""
)

# KEYS: delayed, stream, prefix, leases; ARGV: now. Jobs whose back-off is over, back on the
# stream; then the first job whose lease ran out (its worker died), with its entry, if any.
DUE = (
    ALLOW_OOM
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  local entry = redis.call('XADD', KEYS[2], '*', 'id', id)
  redis.call('HSET', KEYS[3] .. id, 'entry', entry)
  redis.call('ZREM', KEYS[1], id)
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #expired == 0 then return false end
local entry = redis.call('HGET', KEYS[3] .. expired[1], 'entry')
if not entry then return false end
return {expired[1], entry}
"""
)

# KEYS: job, stream, leases; ARGV: id, token, group, consumer, until. The lease renewed (and
# the entry's idle time reset), if the job is still this worker's.
RENEW = (
    ALLOW_OOM
    + """
local status, token, entry = unpack(redis.call('HMGET', KEYS[1], 'status', 'token', 'entry'))
if status ~= 'running' or token ~= ARGV[2] or not entry then return 0 end
redis.call('XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, entry, 'JUSTID')
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return 1
"""
)

# KEYS: job, callbacks; ARGV: id. An expired job gone, and its idempotency key if it still
# names it, and its callback if one was still tried.
FORGET = (
    ALLOW_OOM
    + """
local idem = redis.call('HGET', KEYS[1], 'idem')
if idem and redis.call('GET', idem) == ARGV[1] then redis.call('DEL', idem) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""
)

# KEYS: job, callbacks; ARGV: id, outcome, retry_at ('' : none). How a try of the callback went;
# the callback due again then, or out of the outbox. A job gone (expired) is not made again.
CALLBACK_DONE = (
    ALLOW_OOM
    + """
local kept = redis.call('EXISTS', KEYS[1]) == 1
if kept then redis.call('HSET', KEYS[1], 'callback_status', ARGV[2]) end
if kept and ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
"""
)

# KEYS: callbacks; ARGV: now, until, most. The callbacks due, each held until then.
CALLBACKS_DUE = (
    ALLOW_OOM
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
return due
"""
)
