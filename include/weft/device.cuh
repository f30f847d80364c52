// weft/device.cuh - the whole device language: include this in a kernel file.
#pragma once

#include "weft/device/copy.cuh"
#include "weft/device/ll.cuh"
#include "weft/device/memory.cuh"
#include "weft/device/reduce.cuh"
#include "weft/device/shmem.cuh"
#include "weft/device/signal.cuh"
#include "weft/device/types.cuh"
#include "weft/device/world.cuh"
