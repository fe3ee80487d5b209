-- wrk script piece, run with dofile: numbers the threads 1, 2, ... in each thread's global `id`, for
-- scripts whose requests differ by thread.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
