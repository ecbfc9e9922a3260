#pragma once
/** @file Observability: Chrome trace output and text timelines. */
#include "mpar/observe/chrome_trace.hpp"
#include "mpar/observe/text_timeline.hpp"
