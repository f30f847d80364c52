// weft/device/types.cuh - the vocabulary every device call is spelled in: scope, comparison, signal op.
// Defined in core (weft/core/signal_types.hpp), where the host side reads them too.
#pragma once

#include "weft/core/signal_types.hpp"
