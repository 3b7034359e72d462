// Small server-side SVG charts for `miles report`: line charts (with shaded bands), stacked bar
// charts (with line overlays) and histograms, each with ticked, labelled axes and a legend.
//
// Why our own: the report must be one self-contained HTML file that renders without network
// access or JavaScript; a few hundred lines of SVG text are enough for per-step training curves.
// NaN values are holes (a line breaks there, a bar counts 0); no NaN ever reaches the SVG text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace miles::report {

struct Series {
  std::string label;
  std::vector<double> y;  // one per x; NaN = no value
  std::string color;      // CSS colour
  bool dashed = false;
};

struct Band {  // a shaded area between lo and hi (mean ± std)
  std::string label;
  std::vector<double> lo, hi;
  std::string color;
};

struct ChartText {
  std::string id;  // the svg's id (plot-<id>)
  std::string title, x_label, y_label;
  int width = 640, height = 280;
};

// y against x; x is the rollout step (integer ticks).
std::string line_chart(const ChartText& t, const std::vector<double>& x,
                       const std::vector<Series>& series, const std::vector<Band>& bands = {});
// One bar per x, `layers` stacked from 0 (NaN or negative = 0), `lines` drawn over the bars.
std::string stacked_bar_chart(const ChartText& t, const std::vector<double>& x,
                              const std::vector<Series>& layers,
                              const std::vector<Series>& lines = {});
// Counts of the finite `values` in equal-width bins (about sqrt(n) of them).
std::string histogram_chart(const ChartText& t, const std::vector<double>& values,
                            const std::string& color);

// The i-th colour of the charts' palette (ten, then again).
const char* palette_color(size_t i);

// &, <, >, " and ' as entities: for HTML text, attribute values and SVG text.
std::string html_escape(std::string_view s);
// A short decimal for labels and tables: 4 significant digits, no "-0", "n/a" for NaN.
std::string format_number(double v);

}  // namespace miles::report
