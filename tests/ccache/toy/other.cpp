#include "plain.h"
int plain_value() { return PLAIN_VALUE; }
