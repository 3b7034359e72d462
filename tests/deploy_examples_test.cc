// The deployment examples parse and agree with `miles`: scripts/slurm/miles_run.sbatch passes
// `bash -n`; scripts/k8s/miles-run.yaml is valid YAML whose documents are well-formed Kubernetes
// objects, whose job file is a valid `miles run` config with the controller's overrides, and whose
// engines and remote trainer ranks call the controller's Service at the port it listens on.
//
// Why: examples rot silently; these checks are fast (no cluster, no model) and catch a renamed
// config key, a port changed in one place only, or a syntax slip.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "miles/controller/run_config.h"
#include "test_paths.h"

namespace miles {
namespace {

const std::string kSbatch = "/scripts/slurm/miles_run.sbatch";
const std::string kManifest = "/scripts/k8s/miles-run.yaml";

std::vector<std::string> strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const YAML::Node& n : list) out.push_back(n.as<std::string>());
  return out;
}

// The value after `flag` in `args` ("" when absent).
std::string after(const std::vector<std::string>& args, const std::string& flag) {
  auto it = std::find(args.begin(), args.end(), flag);
  return it == args.end() || it + 1 == args.end() ? "" : *(it + 1);
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(DeployExamples, SlurmScriptIsValidBash) {
  const std::string cmd = "bash -n '" + test::source_dir() + kSbatch + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[1024];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
}

// The Slurm script hands the run's token to the engine and trainer steps by environment, not by
// argument.
TEST(DeployExamples, SlurmScriptPassesTheRunToken) {
  std::ifstream in(test::source_dir() + kSbatch);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("export MILES_RUN_TOKEN"), std::string::npos);
  EXPECT_NE(text.find("--export=ALL,MILES_API_KEY"), std::string::npos);
  EXPECT_NE(text.find("--export=ALL,MILES_RUN_TOKEN"), std::string::npos);  // remote trainer ranks
  EXPECT_NE(text.find("train-worker --controller \"$CONTROLLER\""), std::string::npos);
  EXPECT_EQ(text.find("--api-key "), std::string::npos);
}

TEST(DeployExamples, KubernetesManifestIsConsistent) {
  std::vector<YAML::Node> docs;
  ASSERT_NO_THROW(docs = YAML::LoadAllFromFile(test::source_dir() + kManifest));
  YAML::Node pvc, config_map, service, job, trainer_job, engines;
  for (const YAML::Node& d : docs) {
    ASSERT_TRUE(d["apiVersion"] && d["kind"] && d["metadata"]["name"]) << YAML::Dump(d);
    const std::string kind = d["kind"].as<std::string>();
    const std::string name = d["metadata"]["name"].as<std::string>();
    if (kind == "PersistentVolumeClaim") pvc = d;
    if (kind == "ConfigMap") config_map = d;
    if (kind == "Service") service = d;
    if (kind == "Job" && name == "miles-controller") job = d;
    if (kind == "Job" && name == "miles-trainer") trainer_job = d;
    if (kind == "Deployment" || kind == "StatefulSet") engines = d;
  }
  ASSERT_TRUE(pvc && config_map && service && job && trainer_job && engines);
  EXPECT_TRUE(contains(strings(pvc["spec"]["accessModes"]), "ReadWriteMany"));

  const YAML::Node controller = job["spec"]["template"]["spec"]["containers"][0];
  const YAML::Node engine = engines["spec"]["template"]["spec"]["containers"][0];
  const YAML::Node trainer = trainer_job["spec"]["template"]["spec"]["containers"][0];
  const std::vector<std::string> worker_args = strings(trainer["args"]);
  ASSERT_EQ(worker_args.at(0), "train-worker");
  const std::vector<std::string> run_args = strings(controller["args"]);
  const std::vector<std::string> serve_args = strings(engine["args"]);
  ASSERT_EQ(run_args.at(0), "run");
  ASSERT_EQ(serve_args.at(0), "serve");

  // The run's token: the controller's MILES_RUN_TOKEN and the engines' MILES_API_KEY come from the
  // same Secret, never from args.
  auto secret_of = [](const YAML::Node& container, const std::string& var) {
    for (const YAML::Node& e : container["env"])
      if (e["name"].as<std::string>() == var && e["valueFrom"]["secretKeyRef"])
        return e["valueFrom"]["secretKeyRef"]["name"].as<std::string>() + "/" +
               e["valueFrom"]["secretKeyRef"]["key"].as<std::string>();
    return std::string();
  };
  EXPECT_FALSE(secret_of(controller, "MILES_RUN_TOKEN").empty());
  EXPECT_EQ(secret_of(controller, "MILES_RUN_TOKEN"), secret_of(engine, "MILES_API_KEY"));
  EXPECT_EQ(secret_of(controller, "MILES_RUN_TOKEN"), secret_of(trainer, "MILES_RUN_TOKEN"));
  // The engines trust the run's weight directory for weight updates.
  EXPECT_EQ(after(serve_args, "--weights-dir"), after(run_args, "--run-dir") + "/weights");

  // The job file with the controller's overrides is a valid config.
  std::vector<std::string> overrides;
  for (const std::string& a : run_args)
    if (a.find('=') != std::string::npos && a.rfind("--", 0) != 0) overrides.push_back(a);
  overrides.push_back("logging.run_dir=" + after(run_args, "--run-dir"));
  auto cfg =
      parse_run_config(config_map["data"]["job.yaml"].as<std::string>(), "job.yaml", overrides);
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->rollout.num_engines, 0);
  EXPECT_EQ(cfg->controller.host, "0.0.0.0");

  // The engines call the Service at the controller's port, advertise their pod IP, and load the
  // trainer's model.
  const std::string port = std::to_string(cfg->controller.port);
  EXPECT_EQ(std::to_string(service["spec"]["ports"][0]["port"].as<int>()), port);
  EXPECT_EQ(after(serve_args, "--controller"),
            service["metadata"]["name"].as<std::string>() + ":" + port);
  EXPECT_EQ(after(serve_args, "--host"), "0.0.0.0");
  EXPECT_EQ(after(serve_args, "--advertise-host"), "$(POD_IP)");
  EXPECT_EQ(engine["env"][0]["name"].as<std::string>(), "POD_IP");
  EXPECT_EQ(after(serve_args, "--model"), cfg->model.path);
  EXPECT_EQ(controller["ports"][0]["containerPort"].as<int>(), cfg->controller.port);

  // The remote trainer ranks: as many pods as parallel.remote_ranks, calling the same Service,
  // binding their pod IP; the controller's ranks bind theirs.
  EXPECT_GT(cfg->parallel.remote_ranks, 0);
  EXPECT_EQ(cfg->parallel.comm, TrainerComm::kGloo);
  EXPECT_EQ(trainer_job["spec"]["parallelism"].as<int64_t>(), cfg->parallel.remote_ranks);
  EXPECT_EQ(after(worker_args, "--controller"), after(serve_args, "--controller"));
  EXPECT_EQ(after(worker_args, "--host"), "$(POD_IP)");
  EXPECT_EQ(cfg->parallel.host, "$(POD_IP)");
  for (const YAML::Node* c : {&controller, &trainer})
    EXPECT_EQ((*c)["env"][0]["name"].as<std::string>(), "POD_IP");

  // Both mount the shared volume at the same path, and the run directory is on it.
  const auto shared_mount = [](const YAML::Node& c) {
    for (const YAML::Node& m : c["volumeMounts"])
      if (m["name"].as<std::string>() == "shared") return m["mountPath"].as<std::string>();
    return std::string();
  };
  const std::string mount = shared_mount(controller);
  ASSERT_FALSE(mount.empty());
  EXPECT_EQ(shared_mount(engine), mount);
  EXPECT_EQ(shared_mount(trainer), mount);
  EXPECT_EQ(cfg->logging.run_dir.rfind(mount + "/", 0), 0u) << cfg->logging.run_dir;
  EXPECT_EQ(cfg->weight_sync.dir.rfind(mount + "/", 0), 0u) << cfg->weight_sync.dir;
}

}  // namespace
}  // namespace miles
