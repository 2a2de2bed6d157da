# What gtest_register.cmake and gtest_groups.cmake share.

# A GoogleTest filter as a regular expression of the whole name.
function(ddp_filter_regex filter out)
  string(REGEX REPLACE "([.+^$()|\\[\\]\\\\])" "\\\\\\1" regex "${filter}")
  string(REPLACE "*" ".*" regex "${regex}")
  string(REPLACE "?" "." regex "${regex}")
  set(${out} "^${regex}$" PARENT_SCOPE)
endfunction()
