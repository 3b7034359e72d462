// Line, stacked-bar and histogram charts (svg_plot.h) inside the frame of svg_frame.h.
#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "report/svg_frame.h"

namespace miles::report {
namespace {

using svg::num;

constexpr size_t kMaxMarkers = 60;  // above this many points a line has no dots

bool finite(const std::vector<double>& v, size_t i) { return i < v.size() && std::isfinite(v[i]); }

bool any_finite(const std::vector<double>& v) {
  for (double d : v)
    if (std::isfinite(d)) return true;
  return false;
}

std::string point_title(const std::string& label, double x, double y) {
  return "<title>" + html_escape(label) + " @ step " + format_number(x) + ": " + format_number(y) +
         "</title>";
}

// The smallest gap between consecutive x (1 when fewer than two points).
double min_spacing(const std::vector<double>& x) {
  double d = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    const double g = std::fabs(x[i] - x[i - 1]);
    if (g > 0 && (d == 0 || g < d)) d = g;
  }
  return d > 0 ? d : 1;
}

void draw_line(std::string& out, const svg::Frame& f, const std::vector<double>& x,
               const Series& s) {
  std::string d;
  size_t points = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!finite(s.y, i) || !std::isfinite(x[i])) continue;
    const bool joined = i > 0 && finite(s.y, i - 1) && std::isfinite(x[i - 1]);
    d += (joined ? " L" : " M") + num(f.px(x[i])) + " " + num(f.py(s.y[i]));
    ++points;
  }
  if (points == 0) return;
  const std::string c = html_escape(s.color);
  out += "<path class=\"series\" d=\"" + d.substr(1) + "\" fill=\"none\" stroke=\"" + c +
         "\" stroke-width=\"1.8\"" + (s.dashed ? " stroke-dasharray=\"5 3\"" : "") + "/>\n";
  for (size_t i = 0; i < x.size(); ++i) {
    if (!finite(s.y, i) || !std::isfinite(x[i])) continue;
    const bool isolated =
        !(i > 0 && finite(s.y, i - 1)) && !(i + 1 < x.size() && finite(s.y, i + 1));
    if (points > kMaxMarkers && !isolated) continue;
    out += "<circle cx=\"" + num(f.px(x[i])) + "\" cy=\"" + num(f.py(s.y[i])) +
           "\" r=\"2.6\" fill=\"" + c + "\">" + point_title(s.label, x[i], s.y[i]) + "</circle>\n";
  }
}

void draw_band(std::string& out, const svg::Frame& f, const std::vector<double>& x, const Band& b) {
  auto ok = [&](size_t i) { return finite(b.lo, i) && finite(b.hi, i) && std::isfinite(x[i]); };
  for (size_t i = 0; i < x.size();) {
    if (!ok(i)) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < x.size() && ok(j + 1)) ++j;
    std::string pts;
    for (size_t k = i; k <= j; ++k) pts += num(f.px(x[k])) + "," + num(f.py(b.hi[k])) + " ";
    for (size_t k = j + 1; k-- > i;) pts += num(f.px(x[k])) + "," + num(f.py(b.lo[k])) + " ";
    if (i == j) {  // one point: a short vertical bar
      out += "<line x1=\"" + num(f.px(x[i])) + "\" y1=\"" + num(f.py(b.hi[i])) + "\" x2=\"" +
             num(f.px(x[i])) + "\" y2=\"" + num(f.py(b.lo[i])) + "\" stroke=\"" +
             html_escape(b.color) + "\" stroke-opacity=\"0.5\" stroke-width=\"6\"/>\n";
    } else {
      pts.pop_back();
      out += "<polygon class=\"band\" points=\"" + pts + "\" fill=\"" + html_escape(b.color) +
             "\" fill-opacity=\"0.18\" stroke=\"none\"/>\n";
    }
    i = j + 1;
  }
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "n/a";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  char b[64];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string line_chart(const ChartText& t, const std::vector<double>& x,
                       const std::vector<Series>& series, const std::vector<Band>& bands) {
  std::vector<double> ys;
  std::vector<svg::LegendItem> legend;
  for (const Band& b : bands) {
    ys.insert(ys.end(), b.lo.begin(), b.lo.end());
    ys.insert(ys.end(), b.hi.begin(), b.hi.end());
    if (any_finite(b.lo) && any_finite(b.hi)) legend.push_back({b.label, b.color, false, true});
  }
  for (const Series& s : series) {
    ys.insert(ys.end(), s.y.begin(), s.y.end());
    if (any_finite(s.y)) legend.push_back({s.label, s.color, s.dashed, false});
  }
  double x0, x1, y0, y1;
  svg::finite_range(x, x0, x1);
  svg::finite_range(ys, y0, y1);
  std::string out;
  const svg::Frame f = svg::begin_chart(out, t, svg::nice_ticks(x0, x1, 8, true, false, true),
                                        svg::nice_ticks(y0, y1, 5, false), legend);
  for (const Band& b : bands) draw_band(out, f, x, b);
  for (const Series& s : series) draw_line(out, f, x, s);
  svg::end_chart(out, f);
  return out;
}

std::string stacked_bar_chart(const ChartText& t, const std::vector<double>& x,
                              const std::vector<Series>& layers, const std::vector<Series>& lines) {
  auto part = [](const Series& s, size_t i) {
    return finite(s.y, i) ? std::max(s.y[i], 0.0) : 0.0;
  };
  std::vector<double> top(x.size(), 0.0);
  for (const Series& s : layers)
    for (size_t i = 0; i < x.size(); ++i) top[i] += part(s, i);
  std::vector<svg::LegendItem> legend;
  for (const Series& s : layers)
    if (any_finite(s.y)) legend.push_back({s.label, s.color, false, true});
  for (const Series& s : lines) {
    top.insert(top.end(), s.y.begin(), s.y.end());
    if (any_finite(s.y)) legend.push_back({s.label, s.color, s.dashed, false});
  }
  const double dx = min_spacing(x);
  double x0, x1, y0, y1;
  svg::finite_range(x, x0, x1);
  svg::finite_range(top, y0, y1);
  const svg::Ticks xt = svg::nice_ticks(x0 - dx / 2, x1 + dx / 2, 8, true, false, true);
  std::string out;
  const svg::Frame f =
      svg::begin_chart(out, t, xt, svg::nice_ticks(y0, y1, 5, false, true), legend);
  const double w = std::max(0.3, (f.px(dx) - f.px(0)) * 0.8);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) continue;
    double base = 0;
    for (const Series& s : layers) {
      const double v = part(s, i);
      if (v <= 0) continue;
      out += "<rect x=\"" + num(f.px(x[i]) - w / 2) + "\" y=\"" + num(f.py(base + v)) +
             "\" width=\"" + num(w) + "\" height=\"" + num(f.py(base) - f.py(base + v)) +
             "\" fill=\"" + html_escape(s.color) + "\">" + point_title(s.label, x[i], v) +
             "</rect>\n";
      base += v;
    }
  }
  for (const Series& s : lines) draw_line(out, f, x, s);
  svg::end_chart(out, f);
  return out;
}

std::string histogram_chart(const ChartText& t, const std::vector<double>& values,
                            const std::string& color) {
  std::vector<double> v;
  for (double d : values)
    if (std::isfinite(d)) v.push_back(d);
  double lo, hi;
  svg::finite_range(v, lo, hi);
  // About sqrt(n) bins on [lo, hi]; when all values are equal, one narrow bin centred on them.
  size_t bins = 1;
  if (hi > lo) bins = std::min<size_t>(30, static_cast<size_t>(std::ceil(std::sqrt(v.size()))));
  const svg::Ticks xt = svg::nice_ticks(lo, hi, 6, false);
  double b0 = lo, b1 = hi;
  if (!(hi > lo)) {
    const double half = (xt.hi - xt.lo) / 20;
    b0 = (std::isfinite(lo) ? lo : 0.5) - half;
    b1 = b0 + 2 * half;
  }
  const double width = (b1 - b0) / static_cast<double>(bins);
  std::vector<double> count(bins, 0.0);
  for (double d : v) {
    double k = std::floor((d - b0) / width);
    if (!(k >= 0)) k = 0;
    k = std::min(k, static_cast<double>(bins - 1));  // the top edge goes in the last bin
    count[static_cast<size_t>(k)] += 1;
  }
  double cmax = 0;
  for (double c : count) cmax = std::max(cmax, c);
  std::string out;
  const svg::Frame f = svg::begin_chart(out, t, xt, svg::nice_ticks(0, cmax, 5, true, true),
                                        {{"steps per bin", color, false, true}});
  for (size_t k = 0; k < bins; ++k) {
    if (count[k] == 0) continue;
    const double a = b0 + width * static_cast<double>(k), b = a + width;
    out += "<rect x=\"" + num(f.px(a) + 0.5) + "\" y=\"" + num(f.py(count[k])) + "\" width=\"" +
           num(std::max(0.5, f.px(b) - f.px(a) - 1)) + "\" height=\"" +
           num(f.py(0) - f.py(count[k])) + "\" fill=\"" + html_escape(color) + "\"><title>[" +
           format_number(a) + ", " + format_number(b) + "]: " + format_number(count[k]) +
           " steps</title></rect>\n";
  }
  svg::end_chart(out, f);
  return out;
}

const char* palette_color(size_t i) {
  static const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kPalette[i % std::size(kPalette)];
}

}  // namespace miles::report
