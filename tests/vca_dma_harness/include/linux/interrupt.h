/* the harness stands in for the kernel: everything is in vca_shim.h */
#include "vca_shim.h"
