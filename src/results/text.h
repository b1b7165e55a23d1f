// Console text for a record's figures, shared by the runner's progress lines and the report's
// terminal summary so both print a time the same way.
#pragma once

#include <string>

namespace ab::results {

// 4 significant digits in us, ms or s: "12.35 us", "4.5 ms", "1.234 s".
std::string format_seconds(double s);

}  // namespace ab::results
