#pragma once
#include <cstdio>
#include "in_pch.h"
