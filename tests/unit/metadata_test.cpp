// Being written (issue 13).
#include <gtest/gtest.h>
