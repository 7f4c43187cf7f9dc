#include "plan_svg.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace cli {

namespace {

constexpr double kWidth = 1200, kLeft = 90, kRight = 20;
constexpr double kPlotW = kWidth - kLeft - kRight;
constexpr double kMemTop = 50, kMemH = 320;  // the memory chart
constexpr double kLaneTop = kMemTop + kMemH + 60, kLaneH = 34, kLaneGap = 8;

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  return o;
}

// 1, 2 or 5 times a power of ten: about `n` ticks over [0, hi].
double tick_step(double hi, int n) {
  if (hi <= 0) return 1;
  const double raw = hi / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string seconds_label(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%g s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%g ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%g µs", s * 1e6);
  return buf;
}

struct Series {
  const char* key;    // in occupancy_fields
  const char* label;  // in the legend
  const char* color;
};

// Bottom to top.
const Series kSeries[] = {
    {"input", "inputs", "#9e9e9e"},
    {"activation", "activations (kept, or before their swap or drop)", "#4e79a7"},
    {"swapped", "swapped activations, back on the device", "#59a14f"},
    {"recomputed", "recomputed activations", "#f28e2b"},
    {"gradient", "gradients", "#e15759"},
    {"workspace", "kernel workspaces", "#b07aa1"},
    {"paged", "paged weights and optimizer state, copied in", "#edc948"},
};

}  // namespace

std::string plan_svg(const Json& plan, const std::string& title) {
  const double budget = plan.value("budget", 0.0), arena = plan.value("arena", 0.0);
  const double persistent = plan.value("persistent_bytes", 0.0);
  const double step = std::max(plan.value("predicted_seconds", 0.0), 1e-12);
  const Json fields = plan.value("occupancy_fields", Json::array());
  const Json occ = plan.value("occupancy", Json::array());
  auto field = [&](const char* name) -> int {
    for (size_t i = 0; i < fields.size(); ++i)
      if (fields[i] == name) return static_cast<int>(i);
    return -1;
  };
  const int f_start = field("start"), f_end = field("end"), f_top = field("top");
  auto at = [](const Json& row, int i) {
    return i >= 0 && i < int(row.size()) ? row[size_t(i)].get<double>() : 0.0;
  };

  // A budget far above the arena (the whole device, no --device-memory) would
  // flatten the chart: it is drawn only when it is within twice the arena.
  const bool show_budget = budget > 0 && budget <= 2 * arena;
  double y_max = std::max({show_budget ? budget : 0.0, arena, persistent, 1.0});
  for (const Json& row : occ) y_max = std::max(y_max, persistent + at(row, f_top));
  y_max *= 1.05;
  auto X = [&](double t) { return kLeft + kPlotW * std::clamp(t / step, 0.0, 1.0); };
  auto Y = [&](double b) { return kMemTop + kMemH * (1 - b / y_max); };

  std::string s;
  const double height = kLaneTop + 3 * (kLaneH + kLaneGap) + 60 + 22 * 6;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" +
       num(height) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(height) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(kLeft) + "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" +
       escape(title) + "</text>\n";
  char sub[256];
  std::snprintf(sub, sizeof sub,
                "strategy %s; arena %.2f MiB of a %.2f MiB budget; predicted step %s "
                "(in core %s)",
                plan.value("strategy", std::string("?")).c_str(), arena / 1048576.0,
                budget / 1048576.0, seconds_label(step).c_str(),
                seconds_label(plan.value("predicted_in_core_seconds", 0.0)).c_str());
  s += "<text x=\"" + num(kLeft) + "\" y=\"40\" fill=\"#444\">" + escape(sub) + "</text>\n";

  // Axes and grid.
  const double ty = tick_step(y_max / 1048576.0, 6) * 1048576.0;
  for (double b = 0; b <= y_max; b += ty) {
    s += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + kPlotW) + "\" y1=\"" + num(Y(b)) +
         "\" y2=\"" + num(Y(b)) + "\" stroke=\"#e0e0e0\"/>\n";
    char lab[32];
    std::snprintf(lab, sizeof lab, "%g MiB", b / 1048576.0);
    s += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(Y(b) + 4) + "\" text-anchor=\"end\">" +
         lab + "</text>\n";
  }
  const double tx = tick_step(step, 10);
  const double axis_bottom = kLaneTop + 3 * (kLaneH + kLaneGap);
  for (double t = 0; t <= step * 1.0001; t += tx) {
    s += "<line x1=\"" + num(X(t)) + "\" x2=\"" + num(X(t)) + "\" y1=\"" + num(kMemTop) +
         "\" y2=\"" + num(axis_bottom) + "\" stroke=\"#f0f0f0\"/>\n";
    s += "<text x=\"" + num(X(t)) + "\" y=\"" + num(axis_bottom + 14) +
         "\" text-anchor=\"middle\">" + seconds_label(t) + "</text>\n";
  }
  s += "<text x=\"" + num(kLeft + kPlotW / 2) + "\" y=\"" + num(axis_bottom + 30) +
       "\" text-anchor=\"middle\" fill=\"#444\">simulated time in the step</text>\n";
  s += "<text x=\"16\" y=\"" + num(kMemTop + kMemH / 2) + "\" transform=\"rotate(-90 16 " +
       num(kMemTop + kMemH / 2) + ")\" text-anchor=\"middle\" fill=\"#444\">arena bytes</text>\n";

  // The persistent region: a band under everything.
  s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(Y(persistent)) + "\" width=\"" + num(kPlotW) +
       "\" height=\"" + num(Y(0) - Y(persistent)) +
       "\" fill=\"#bab0ac\"><title>weights and optimizer state</title></rect>\n";

  // Stacked areas: each slot holds its bytes from its start to the next slot's.
  std::vector<double> xs;  // the step function's x at each point, in order
  for (size_t i = 0; i < occ.size(); ++i) {
    const double a = at(occ[i], f_start);
    const double b = i + 1 < occ.size() ? at(occ[i + 1], f_start) : std::max(a, at(occ[i], f_end));
    xs.push_back(a);
    xs.push_back(b);
  }
  std::vector<double> below(occ.size(), persistent);
  for (const Series& ser : kSeries) {
    const int f = field(ser.key);
    if (f < 0) continue;
    std::vector<double> above(occ.size());
    bool any = false;
    for (size_t i = 0; i < occ.size(); ++i) {
      above[i] = below[i] + at(occ[i], f);
      any = any || at(occ[i], f) > 0;
    }
    if (any) {
      std::string pts;
      for (size_t i = 0; i < occ.size(); ++i)
        pts += num(X(xs[2 * i])) + "," + num(Y(above[i])) + " " + num(X(xs[2 * i + 1])) + "," +
               num(Y(above[i])) + " ";
      for (size_t i = occ.size(); i-- > 0;)
        pts += num(X(xs[2 * i + 1])) + "," + num(Y(below[i])) + " " + num(X(xs[2 * i])) + "," +
               num(Y(below[i])) + " ";
      s += "<polygon points=\"" + pts + "\" fill=\"" + ser.color +
           "\" fill-opacity=\"0.85\"><title>" + escape(ser.label) + "</title></polygon>\n";
    }
    below = std::move(above);
  }
  // The arena's high-water mark and the budget.
  auto hline = [&](double b, const char* color, const char* dash, const std::string& label) {
    s += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + kPlotW) + "\" y1=\"" + num(Y(b)) +
         "\" y2=\"" + num(Y(b)) + "\" stroke=\"" + color + "\" stroke-width=\"1.5\"" +
         (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string()) + "/>\n";
    s += "<text x=\"" + num(kLeft + kPlotW - 4) + "\" y=\"" + num(Y(b) - 4) +
         "\" text-anchor=\"end\" fill=\"" + color + "\">" + escape(label) + "</text>\n";
  };
  char lab[96];
  if (show_budget) {
    std::snprintf(lab, sizeof lab, "budget %.2f MiB", budget / 1048576.0);
    hline(budget, "#d62728", "6,4", lab);
  }
  std::snprintf(lab, sizeof lab, "arena %.2f MiB", arena / 1048576.0);
  hline(arena, "#333333", "2,3", lab);
  s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kMemTop) + "\" width=\"" + num(kPlotW) +
       "\" height=\"" + num(kMemH) + "\" fill=\"none\" stroke=\"#888\"/>\n";

  // The streams.
  const char* lanes[] = {"compute", "d2h", "h2d"};
  const char* lane_label[] = {"compute", "device → host", "host → device"};
  for (int l = 0; l < 3; ++l) {
    const double y = kLaneTop + l * (kLaneH + kLaneGap);
    s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(y) + "\" width=\"" + num(kPlotW) +
         "\" height=\"" + num(kLaneH) + "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
    s += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(y + kLaneH / 2 + 4) +
         "\" text-anchor=\"end\">" + lane_label[l] + "</text>\n";
  }
  const Json sf = plan.value("step_fields", Json::array());
  auto sfield = [&](const char* name) -> size_t {
    for (size_t i = 0; i < sf.size(); ++i)
      if (sf[i] == name) return i;
    return 0;
  };
  const size_t k_kind = sfield("kind"), k_stream = sfield("stream"), k_name = sfield("name"),
               k_bytes = sfield("bytes"), k_start = sfield("start"), k_end = sfield("end");
  for (const Json& st : plan.value("steps", Json::array())) {
    const std::string kind = st[k_kind].get<std::string>();
    if (kind != "launch" && kind != "recompute" && kind != "copy_in" && kind != "copy_out")
      continue;
    const std::string stream = st[k_stream].get<std::string>();
    int l = 0;
    while (l < 3 && stream != lanes[l]) ++l;
    if (l == 3) continue;
    const double a = X(st[k_start].get<double>()), b = X(st[k_end].get<double>());
    const double y = kLaneTop + l * (kLaneH + kLaneGap) + 3;
    const std::string name = st[k_name].get<std::string>();
    const char* color = kind == "recompute" ? "#f28e2b"
                        : l == 0            ? "#76b7b2"
                        : l == 1            ? "#8c6bb1"
                                            : "#59a14f";
    char tip[256];
    std::snprintf(tip, sizeof tip, "%s %s, %.0f bytes, %s to %s", kind.c_str(), name.c_str(),
                  st[k_bytes].get<double>(), seconds_label(st[k_start].get<double>()).c_str(),
                  seconds_label(st[k_end].get<double>()).c_str());
    s += "<rect x=\"" + num(a) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.5, b - a)) +
         "\" height=\"" + num(kLaneH - 6) + "\" fill=\"" + color +
         "\" stroke=\"white\" stroke-width=\"0.5\"><title>" + escape(tip) + "</title></rect>\n";
    if (b - a > 7.0 * static_cast<double>(name.size()) + 4)
      s += "<text x=\"" + num((a + b) / 2) + "\" y=\"" + num(y + kLaneH / 2 + 1) +
           "\" text-anchor=\"middle\" font-size=\"10\" fill=\"white\">" + escape(name) +
           "</text>\n";
  }

  // Legend.
  double ly = axis_bottom + 50;
  auto legend = [&](const char* color, const std::string& label) {
    s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(ly - 10) +
         "\" width=\"14\" height=\"12\" fill=\"" + color + "\"/>\n";
    s += "<text x=\"" + num(kLeft + 20) + "\" y=\"" + num(ly) + "\">" + escape(label) + "</text>\n";
  };
  legend("#bab0ac", "weights and optimizer state (persistent)");
  ly += 18;
  for (const Series& ser : kSeries) {
    legend(ser.color, ser.label);
    ly += 18;
  }
  ly = axis_bottom + 50;
  const double lx = kLeft + kPlotW / 2;
  auto legend2 = [&](const char* color, const std::string& label) {
    s += "<rect x=\"" + num(lx) + "\" y=\"" + num(ly - 10) +
         "\" width=\"14\" height=\"12\" fill=\"" + color + "\"/>\n";
    s += "<text x=\"" + num(lx + 20) + "\" y=\"" + num(ly) + "\">" + escape(label) + "</text>\n";
    ly += 18;
  };
  legend2("#76b7b2", "kernel launch (compute stream)");
  legend2("#f28e2b", "recompute launch");
  legend2("#8c6bb1", "copy to the host (swap out, outputs)");
  legend2("#59a14f", "copy to the device (inputs, prefetch)");
  s += "</svg>\n";
  return s;
}

bool write_file_atomic(const std::string& path, const std::string& text, std::string* error) {
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    *error = path + ": cannot write it: " + std::strerror(errno);
    return false;
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    *error = path + ": writing it failed: " + std::strerror(errno);
    std::remove(tmp.c_str());
  }
  return ok;
}

}  // namespace cli
