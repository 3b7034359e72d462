// The command reward: one long-lived `/bin/sh -c COMMAND` that reads a JSON request per line on
// stdin and writes {"score": x} per line on stdout, in order.
//
// Why: graders written in any language (a shell script, a sandbox runner) without an HTTP server.
// The process starts at the first sample and is kept alive; when it dies, hangs past the timeout
// or writes garbage, that sample gets the error and the next sample starts a fresh process.
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "controller/line_process.h"
#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

class CommandScorer : public Scorer {
 public:
  explicit CommandScorer(const RewardSpec& spec)
      : command_(spec.command), timeout_s_(spec.timeout_s) {}

  std::vector<Result<double>> score(std::span<const RewardInput> inputs) override {
    std::vector<Result<double>> out;
    out.reserve(inputs.size());
    for (const RewardInput& input : inputs) {
      try {
        out.push_back(score_one(input));
      } catch (const std::exception& e) {
        process_.reset();
        out.push_back(Status::Error(std::string("command reward failed: ") + e.what()));
      }
    }
    return out;
  }

 private:
  Result<double> score_one(const RewardInput& input) {
    if (process_) {
      Result<bool> idle = process_->check_idle();
      if (!idle.ok() || !idle.value()) process_.reset();
      if (!idle.ok()) return fail(idle.status());  // out of step: this reply cannot be trusted
    }
    if (!process_) {
      auto spawned = LineProcess::spawn(command_);
      if (!spawned.ok()) return fail(spawned.status());
      process_ = std::move(spawned).value();
    }
    Result<std::string> reply = process_->exchange(request_json(input), timeout_s_);
    if (!reply.ok()) return fail(reply.status());
    Result<double> score = parse_score_reply(reply.value());
    if (!score.ok()) return fail(score.status());
    return score;
  }

  // Every failure leaves the protocol in an unknown state: the process goes, the next sample
  // starts another.
  Status fail(const Status& status) {
    process_.reset();
    return Status::Error(status.message() + " (command '" + excerpt(command_, 60) + "')");
  }

  std::string command_;
  double timeout_s_;
  std::unique_ptr<LineProcess> process_;  // null until the first sample and after a failure
};

}  // namespace

Result<std::unique_ptr<Scorer>> make_command_scorer(const RewardSpec& spec) {
  return std::unique_ptr<Scorer>(new CommandScorer(spec));
}

}  // namespace miles::reward
