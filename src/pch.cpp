// Compiled only to build the precompiled header.
