#pragma once
// A header behind the precompiled header (as LibTorch's are).
inline const char* in_pch() { return "one"; }
