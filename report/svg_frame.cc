// The chart frame (svg_frame.h).
#include "report/svg_frame.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace miles::report::svg {
namespace {

constexpr double kLeft = 76, kRight = 18, kTitle = 24, kLegendRow = 16, kBottom = 44;
constexpr double kCharPx = 6.2;  // average glyph width at 11px, for legend wrapping

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Legend items placed in rows across the plot width: the x of each item and the row count.
int layout_legend(const std::vector<LegendItem>& items, double width, std::vector<double>& x,
                  std::vector<int>& row) {
  double cx = kLeft;
  int r = 0;
  for (const LegendItem& it : items) {
    const double w = 24 + kCharPx * static_cast<double>(it.label.size()) + 14;
    if (cx + w > width - kRight && cx > kLeft) {
      ++r;
      cx = kLeft;
    }
    x.push_back(cx);
    row.push_back(r);
    cx += w;
  }
  return items.empty() ? 0 : r + 1;
}

}  // namespace

std::string num(double v) {
  if (!std::isfinite(v)) v = 0;  // never NaN in SVG text (the domains cover the data)
  std::string s = fmt("%.1f", v);
  return s == "-0.0" ? "0.0" : s;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0;
  const double mag = std::max(std::fabs(v), step);
  if (mag >= 1e6 || step < 1e-3) return fmt("%.3g", v);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

void finite_range(const std::vector<double>& v, double& min, double& max) {
  min = max = NAN;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    min = std::isnan(min) ? x : std::min(min, x);
    max = std::isnan(max) ? x : std::max(max, x);
  }
}

Ticks nice_ticks(double min, double max, int target, bool integer, bool from_zero, bool tight) {
  if (!std::isfinite(min) || !std::isfinite(max) || !std::isfinite(max - min)) {
    min = 0;
    max = 1;
  }
  if (from_zero && min >= 0) min = 0;
  if (max - min <= std::fabs(max) * 1e-12) {  // one value: widen around it
    const double pad = integer ? 1.0 : (max == 0 ? 1.0 : std::fabs(max) * 0.1);
    const bool nonneg = min >= 0;
    min -= pad;
    max += pad;
    if (nonneg && min < 0) min = 0;
  }
  double step = (max - min) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(step)));
  const double norm = step / mag;
  step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(step, 1.0);
  Ticks t;
  t.step = step;
  t.lo = std::floor(min / step + 1e-9) * step;
  t.hi = std::ceil(max / step - 1e-9) * step;
  const int n = static_cast<int>(std::lround((t.hi - t.lo) / step));
  for (int i = 0; i <= n; ++i) {
    double v = t.lo + i * step;
    if (std::fabs(v) < step * 1e-9) v = 0;
    if (tight && (v < min - step * 1e-9 || v > max + step * 1e-9)) continue;
    t.at.push_back(v);
  }
  if (tight) {
    t.lo = min;
    t.hi = max;
  }
  return t;
}

double Frame::px(double x) const { return left + (x - xt.lo) / (xt.hi - xt.lo) * (right - left); }
double Frame::py(double y) const { return bottom - (y - yt.lo) / (yt.hi - yt.lo) * (bottom - top); }

Frame begin_chart(std::string& out, const ChartText& t, const Ticks& xt, const Ticks& yt,
                  const std::vector<LegendItem>& legend) {
  std::vector<double> lx;
  std::vector<int> lrow;
  const int rows = layout_legend(legend, t.width, lx, lrow);
  Frame f;
  f.xt = xt;
  f.yt = yt;
  f.left = kLeft;
  f.right = t.width - kRight;
  f.top = kTitle + kLegendRow * rows + 8;
  f.bottom = t.height - kBottom;
  const std::string w = std::to_string(t.width), h = std::to_string(t.height);
  out += "<svg id=\"plot-" + html_escape(t.id) + "\" class=\"chart\" width=\"" + w +
         "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h + "\" role=\"img\" aria-label=\"" +
         html_escape(t.title) + "\">\n<title>" + html_escape(t.title) + "</title>\n";
  out += "<text class=\"title\" x=\"" + num(kLeft) + "\" y=\"16\">" + html_escape(t.title) +
         "</text>\n";
  for (size_t i = 0; i < legend.size(); ++i) {
    const LegendItem& it = legend[i];
    const double y = kTitle + kLegendRow * lrow[i] + 4;
    const std::string c = html_escape(it.color);
    if (it.box) {
      out += "<rect x=\"" + num(lx[i]) + "\" y=\"" + num(y - 5) +
             "\" width=\"18\" height=\"10\" fill=\"" + c + "\" fill-opacity=\"0.6\"/>";
    } else {
      out += "<line x1=\"" + num(lx[i]) + "\" y1=\"" + num(y) + "\" x2=\"" + num(lx[i] + 18) +
             "\" y2=\"" + num(y) + "\" stroke=\"" + c + "\" stroke-width=\"2\"" +
             (it.dashed ? " stroke-dasharray=\"5 3\"" : "") + "/>";
    }
    out += "<text class=\"legend\" x=\"" + num(lx[i] + 23) + "\" y=\"" + num(y + 4) + "\">" +
           html_escape(it.label) + "</text>\n";
  }
  for (double v : yt.at) {  // horizontal grid and y ticks
    const std::string y = num(f.py(v));
    out += "<line class=\"grid\" x1=\"" + num(f.left) + "\" y1=\"" + y + "\" x2=\"" + num(f.right) +
           "\" y2=\"" + y + "\"/><text class=\"tick\" x=\"" + num(f.left - 6) + "\" y=\"" + y +
           "\" dy=\"3.5\" text-anchor=\"end\">" + tick_label(v, yt.step) + "</text>\n";
  }
  for (double v : xt.at) {
    const std::string x = num(f.px(v));
    out += "<line class=\"axis\" x1=\"" + x + "\" y1=\"" + num(f.bottom) + "\" x2=\"" + x +
           "\" y2=\"" + num(f.bottom + 5) + "\"/><text class=\"tick\" x=\"" + x + "\" y=\"" +
           num(f.bottom + 17) + "\" text-anchor=\"middle\">" + tick_label(v, xt.step) + "</text>\n";
  }
  out += "<text class=\"label\" x=\"" + num((f.left + f.right) / 2) + "\" y=\"" +
         num(t.height - 8.0) + "\" text-anchor=\"middle\">" + html_escape(t.x_label) + "</text>\n";
  const std::string ymid = num((f.top + f.bottom) / 2);
  out += "<text class=\"label\" x=\"14\" y=\"" + ymid + "\" text-anchor=\"middle\" " +
         "transform=\"rotate(-90 14 " + ymid + ")\">" + html_escape(t.y_label) + "</text>\n";
  return f;
}

void end_chart(std::string& out, const Frame& f) {
  out += "<line class=\"axis\" x1=\"" + num(f.left) + "\" y1=\"" + num(f.bottom) + "\" x2=\"" +
         num(f.right) + "\" y2=\"" + num(f.bottom) + "\"/>";
  out += "<line class=\"axis\" x1=\"" + num(f.left) + "\" y1=\"" + num(f.top) + "\" x2=\"" +
         num(f.left) + "\" y2=\"" + num(f.bottom) + "\"/>\n</svg>\n";
}

}  // namespace miles::report::svg
