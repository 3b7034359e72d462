// The http reward: POST each sample as JSON to a reward service and read {"score": x} back.
//
// Why: reward models and sandboxed graders run as services. A batch is scored by a few concurrent
// connections (results stay in input order); a service that is down, slow, or replies with an error
// fails only the samples it did not score.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

// Concurrent requests per batch: enough to hide a service's latency, few enough to be polite
// (and within the listen backlog of 5 of an httplib server: more would drop SYNs, a 1 s retry).
constexpr size_t kMaxConnections = 4;
// A reply's body is a score: more than this is a broken service, not a bigger score (the command
// kind bounds its lines the same).
constexpr size_t kMaxReplyBytes = size_t{1} << 20;

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

class HttpScorer : public Scorer {
 public:
  HttpScorer(const RewardSpec& spec, HttpUrl url)
      : url_text_(spec.url), url_(std::move(url)), timeout_s_(spec.timeout_s) {}

  std::vector<Result<double>> score(std::span<const RewardInput> inputs) override {
    if (inputs.empty()) return {};
    std::vector<Result<double>> out(inputs.size(),
                                    Status::Error("not scored: no http client could be created"));
    std::atomic<size_t> next{0};
    auto worker = [&] {
      try {
        httplib::Client client(url_.scheme_host_port);
        configure(client);
        for (size_t i = next++; i < inputs.size(); i = next++) out[i] = post_one(client, inputs[i]);
      } catch (const std::exception&) {
        // Only the client's set-up can throw here (post_one catches its own): other workers, or
        // the error above, take the samples.
      }
    };
    std::vector<std::thread> threads;
    size_t wanted = std::min(inputs.size(), kMaxConnections);
    for (size_t t = 1; t < wanted; ++t) {
      try {
        threads.emplace_back(worker);
      } catch (const std::exception&) {
        break;  // no more threads: the ones running (and this one) share the batch
      }
    }
    worker();
    for (auto& t : threads) t.join();
    return out;
  }

 private:
  void configure(httplib::Client& client) const {
    double timeout_s = bounded_timeout(timeout_s_);
    auto sec = static_cast<time_t>(std::floor(timeout_s));
    auto usec = static_cast<time_t>((timeout_s - static_cast<double>(sec)) * 1e6);
    client.set_connection_timeout(sec, usec);
    client.set_read_timeout(sec, usec);
    client.set_write_timeout(sec, usec);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);  // headers and body go in two writes: no Nagle stall
  }

  Result<double> post_one(httplib::Client& client, const RewardInput& input) const {
    try {
      httplib::Request req;
      req.method = "POST";
      req.path = url_.path;
      req.set_header("Content-Type", "application/json");
      req.body = request_json(input);
      // The reply's body, read up to kMaxReplyBytes (httplib's own buffer has no bound).
      std::string body;
      bool too_long = false;
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (body.size() + n > kMaxReplyBytes) return !(too_long = true);
        body.append(data, n);
        return true;
      };
      auto res = client.send(req);
      if (too_long) {
        return Status::Error("http reply from " + url_text_ + " is longer than " +
                             std::to_string(kMaxReplyBytes) + " bytes");
      }
      if (!res) {
        return Status::Error("http POST " + url_text_ + " failed: " + describe(res.error()));
      }
      if (res->status != 200) {
        return Status::Error("http " + std::to_string(res->status) + " from " + url_text_ + ": " +
                             excerpt(body));
      }
      Result<double> score = parse_score_reply(body);
      if (!score.ok()) return score.status().with_context("http reply from " + url_text_);
      return score;
    } catch (const std::exception& e) {
      return Status::Error("http POST " + url_text_ + " failed: " + e.what());
    }
  }

  std::string describe(httplib::Error error) const {
    switch (error) {
      case httplib::Error::Connection:
        return "could not connect";
      case httplib::Error::ConnectionTimeout:
        return "could not connect within " + seconds_text(timeout_s_);
      case httplib::Error::Read:
        return "no reply within " + seconds_text(timeout_s_) + " (or the connection was lost)";
      case httplib::Error::Write:
        return "could not send the request within " + seconds_text(timeout_s_);
      default:
        return httplib::to_string(error);
    }
  }

  std::string url_text_;
  HttpUrl url_;
  double timeout_s_;
};

}  // namespace

Result<std::unique_ptr<Scorer>> make_http_scorer(const RewardSpec& spec) {
  MILES_ASSIGN_OR_RETURN(HttpUrl url, parse_http_url(spec.url));
  try {
    // A first client here, on the creating thread: it checks that httplib takes the url (https
    // needs its OpenSSL support), and it initializes httplib's static url regex before any
    // worker thread races to it.
    httplib::Client probe(url.scheme_host_port);
    if (!probe.is_valid()) {
      return Status::Error("url '" + spec.url + "': no http client can be made for it");
    }
  } catch (const std::exception& e) {
    return Status::Error("url '" + spec.url + "': " + e.what());
  }
  return std::unique_ptr<Scorer>(new HttpScorer(spec, std::move(url)));
}

}  // namespace miles::reward
