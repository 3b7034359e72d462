// The frame shared by the charts of svg_plot.h: "nice" ticks (1, 2, 5 x 10^k), the plot area and
// its scales, the svg element with title, legend, grid, tick labels and axis labels.
//
// Why separate: the three chart kinds differ only in what they draw inside the frame.
#pragma once

#include <string>
#include <vector>

#include "report/svg_plot.h"

namespace miles::report::svg {

struct Ticks {
  double lo = 0, hi = 1, step = 1;  // the axis domain is [lo, hi]
  std::vector<double> at;
};

// Ticks covering [min, max] (widened when equal; [0, 1] when not finite). integer: step >= 1.
// from_zero: the domain starts at 0 when all values are >= 0 (bars, counts). tight: the domain
// is [min, max] itself, with the ticks that fall inside it (x axes); else it widens to ticks.
Ticks nice_ticks(double min, double max, int target, bool integer, bool from_zero = false,
                 bool tight = false);
// The finite min and max of the values (NaN, NaN when none).
void finite_range(const std::vector<double>& v, double& min, double& max);

struct LegendItem {
  std::string label, color;
  bool dashed = false;
  bool box = false;  // a filled square (bars, bands) rather than a line
};

struct Frame {
  double left = 0, right = 0, top = 0, bottom = 0;  // plot area in px
  Ticks xt, yt;
  double px(double x) const;
  double py(double y) const;
};

// Appends <svg ...>, the title, legend, grid and ticks; returns the plot area.
Frame begin_chart(std::string& out, const ChartText& t, const Ticks& xt, const Ticks& yt,
                  const std::vector<LegendItem>& legend);
// Appends the axis lines and </svg>.
void end_chart(std::string& out, const Frame& f);

// A pixel coordinate ("%.1f").
std::string num(double v);
// A tick label with as many decimals as the step needs.
std::string tick_label(double v, double step);

}  // namespace miles::report::svg
