// The precompiled header shared by every target that includes LibTorch (see DdpHelpers.cmake).
#pragma once
#include <torch/torch.h>
