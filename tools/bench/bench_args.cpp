#include "bench_args.hpp"
