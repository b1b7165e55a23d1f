#include "results/text.h"

#include <iomanip>
#include <sstream>

namespace ab::results {

std::string format_seconds(double s) {
  std::ostringstream o;
  o << std::setprecision(4);
  if (s < 1e-3) o << s * 1e6 << " us";
  else if (s < 1) o << s * 1e3 << " ms";
  else o << s << " s";
  return o.str();
}

}  // namespace ab::results
