-- POST a prepared body (a multipart upload) on every request, and print exact latency
-- percentiles as one JSON line for bench/harness.py to parse.
--
-- Usage: WRK_BODY=/tmp/body.bin WRK_CONTENT_TYPE="multipart/form-data; boundary=..." \
--        wrk -t1 -c1 -d10s --latency -s bench/wrk/post_body.lua http://127.0.0.1:8000/api/v1/predict
local path = os.getenv("WRK_BODY")
local content_type = os.getenv("WRK_CONTENT_TYPE")
if not path or not content_type then
  error("set WRK_BODY (a file holding the request body) and WRK_CONTENT_TYPE")
end
local file = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = content_type

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "mean_us": %.1f, ' ..
    '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "status_errors": %d, "timeouts": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout))
end
