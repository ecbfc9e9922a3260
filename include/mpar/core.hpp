#pragma once
/** @file The core vocabulary: extents, element types, tensors, layouts, the device mesh and initialisation. */
#include "mpar/core/caching_memory_resource.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/extents.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/core/tensor.hpp"
