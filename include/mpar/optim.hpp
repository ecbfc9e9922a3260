#pragma once
/** @file Optimizers and their companions: SGD, AdamW, global-norm clipping, LR schedules, loss scaling. */
#include "mpar/optim/adamw.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/optim/flat_layout.hpp"
#include "mpar/optim/host_factors.hpp"
#include "mpar/optim/loss_scaler.hpp"
#include "mpar/optim/lr_schedule.hpp"
#include "mpar/optim/sgd.hpp"
