#include "cli/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "kernels/common/check.h"
#include "trainer/train/stop_signals.h"

extern char** environ;

namespace fp4moe::cli {
namespace {

using Clock = std::chrono::steady_clock;

// One relayed output stream of a child: the read end of its pipe, where its lines go, the unfinished last line.
struct Stream {
  int fd = -1;
  int out = STDOUT_FILENO;
  std::string partial;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid's status once reaped
  Stream streams[2];
};

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the launcher's own output is gone (a closed pipe): the children still run to the end
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
}

int status_exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// The launcher's environment with `vars` set: an existing variable of the same name is replaced.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& v : vars) replaced = replaced || v.first == name;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (std::string& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

class Supervisor {
 public:
  explicit Supervisor(const LaunchSpec& spec) : spec_(spec) {
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&mask, s);
    FP4MOE_CHECK(sigprocmask(SIG_BLOCK, &mask, &old_mask_) == 0, "sigprocmask: {}", std::strerror(errno));
    sfd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &old_pipe_);  // a closed stdout must not end the launcher before its children
    if (sfd_ < 0) {
      const std::string why = std::strerror(errno);
      restore();
      fail(__FILE__, __LINE__, "signalfd: " + why);
    }
  }
  ~Supervisor() { restore(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  LaunchOutcome run() {
    try {
      for (const ChildSpec& c : spec_.children) start(c);
      supervise();
    } catch (...) {
      kill_and_reap();
      throw;
    }
    return outcome();
  }

 private:
  void restore() {
    if (sfd_ >= 0) close(sfd_);
    sfd_ = -1;
    sigaction(SIGPIPE, &old_pipe_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  void start(const ChildSpec& spec) {
    std::vector<std::string> argv = spec_.argv;
    std::vector<std::string> envp = child_environment(spec.env);
    std::vector<char*> argv_c = c_strings(argv), envp_c = c_strings(envp);
    const std::string exec_error = fmt::format("fp4moe launch: rank {}: cannot run {}: ", spec.rank, spec_.executable);
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    if (spec_.label_output)
      for (auto& p : pipes) FP4MOE_CHECK(pipe2(p, O_CLOEXEC) == 0, "pipe2: {}", std::strerror(errno));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {  // the child: only async-signal-safe calls until execve
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher is gone already
      if (spec_.label_output) {
        dup2(pipes[0][1], STDOUT_FILENO);
        dup2(pipes[1][1], STDERR_FILENO);
      }
      sigaction(SIGPIPE, &old_pipe_, nullptr);
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      execve(spec_.executable.c_str(), argv_c.data(), envp_c.data());
      const char* why = std::strerror(errno);
      (void)!write(STDERR_FILENO, exec_error.data(), exec_error.size());
      (void)!write(STDERR_FILENO, why, std::strlen(why));
      (void)!write(STDERR_FILENO, "\n", 1);
      _exit(127);
    }
    const int fork_errno = errno;
    for (auto& p : pipes)
      if (p[1] >= 0) close(p[1]);
    if (pid < 0) {
      for (auto& p : pipes)
        if (p[0] >= 0) close(p[0]);
      fail(__FILE__, __LINE__, fmt::format("cannot start rank {}: fork: {}", spec.rank, std::strerror(fork_errno)));
    }
    setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any signal is sent
    Child c;
    c.rank = spec.rank;
    c.pid = pid;
    c.running = true;
    c.streams[0] = {pipes[0][0], STDOUT_FILENO, {}};
    c.streams[1] = {pipes[1][0], STDERR_FILENO, {}};
    children_.push_back(std::move(c));
  }

  // After a failure of the launcher itself (pipes, fork, poll): no child is left behind.
  void kill_and_reap() {
    signal_all(SIGKILL);
    for (Child& c : children_)
      if (c.running) waitpid(c.pid, &c.status, 0);
    for (Child& c : children_) c.running = false;
    close_streams();
  }

  void signal_all(int sig) {
    for (const Child& c : children_)
      if (c.running) kill(-c.pid, sig);
  }

  int running() const {
    int n = 0;
    for (const Child& c : children_) n += c.running ? 1 : 0;
    return n;
  }

  // Reaps the children that ended; the first failure (no interrupt under way) stops the others.
  void reap() {
    for (size_t i = 0; i < children_.size(); ++i) {
      Child& c = children_[i];
      if (!c.running || waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
      c.running = false;
      if (succeeded(c.status) || failed_ || interrupt_ != 0) continue;
      failed_ = i;
      signal_all(SIGTERM);
      kill_at_ = Clock::now() + spec_.grace;
    }
  }

  void emit(Stream& s, int rank, const std::string& line) {
    write_all(s.out, fmt::format("[rank {}] {}\n", rank, line));
  }

  void close_stream(Stream& s, int rank) {
    if (!s.partial.empty()) emit(s, rank, s.partial);
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
  }

  void close_streams() {
    for (Child& c : children_)
      for (Stream& s : c.streams)
        if (s.fd >= 0) close_stream(s, c.rank);
  }

  // Reads what is there and writes each complete line with the rank's prefix; closes the stream at its end.
  void relay(Stream& s, int rank) {
    char buf[65536];
    const ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_stream(s, rank);
      return;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = s.partial.find('\n')) != std::string::npos;) {
      emit(s, rank, s.partial.substr(0, nl));
      s.partial.erase(0, nl + 1);
    }
  }

  void on_signals() {
    signalfd_siginfo info;
    while (read(sfd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() follows
      if (interrupt_ == 0 && !failed_) {
        interrupt_ = sig;
        signal_all(sig);
      } else {
        signal_all(SIGKILL);  // a second request to stop, or one while the ranks are being stopped already
      }
    }
  }

  // Until every child was reaped and its output relayed. Output still open after the last child ended (a process
  // it started holds the pipe) is read while it flows and closed after a second of silence.
  void supervise() {
    for (;;) {
      const bool live = running() > 0;
      std::vector<pollfd> fds = {{sfd_, POLLIN, 0}};
      std::vector<Stream*> streams = {nullptr};
      std::vector<int> ranks = {0};
      for (Child& c : children_)
        for (Stream& s : c.streams)
          if (s.fd >= 0) {
            fds.push_back({s.fd, POLLIN, 0});
            streams.push_back(&s);
            ranks.push_back(c.rank);
          }
      if (!live && fds.size() == 1) return;
      int timeout_ms = live ? -1 : 1000;
      if (live && kill_at_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - Clock::now());
        timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
      }
      const int n = poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) fail(__FILE__, __LINE__, fmt::format("poll: {}", std::strerror(errno)));
      if (n == 0 && !live) {
        close_streams();
        return;
      }
      if (n > 0) {
        if (fds[0].revents != 0) on_signals();
        for (size_t i = 1; i < fds.size(); ++i)
          if (fds[i].revents != 0) relay(*streams[i], ranks[i]);
      }
      reap();
      if (kill_at_ && Clock::now() >= *kill_at_) {
        signal_all(SIGKILL);
        kill_at_.reset();
      }
    }
  }

  LaunchOutcome outcome() const {
    if (failed_) {
      const Child& c = children_[*failed_];
      std::string msg = fmt::format("rank {} of {} {}", c.rank, spec_.world_size, status_text(c.status));
      if (children_.size() > 1)
        msg += fmt::format("; the other ranks were stopped (SIGTERM, then SIGKILL after {} ms)", spec_.grace.count());
      return {status_exit_code(c.status), msg};
    }
    if (interrupt_ != 0)
      return {128 + interrupt_, fmt::format("stopped by {}, forwarded to the ranks", stop_signal_name(interrupt_))};
    return {};
  }

  const LaunchSpec& spec_;
  std::vector<Child> children_;
  int sfd_ = -1;
  sigset_t old_mask_;
  struct sigaction old_pipe_ = {};
  std::optional<size_t> failed_;           // index of the first child that failed
  int interrupt_ = 0;                      // the first SIGINT or SIGTERM the launcher received
  std::optional<Clock::time_point> kill_at_;  // when the stopped ranks get SIGKILL
};

}  // namespace

LaunchOutcome run_children(const LaunchSpec& spec) {
  FP4MOE_CHECK(!spec.children.empty() && !spec.argv.empty(), "launch: no rank to start or no command");
  Supervisor s(spec);
  return s.run();
}

}  // namespace fp4moe::cli
