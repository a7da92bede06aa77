/**
 * Wire types of the gpusession REST API.
 *
 * The Python server extension (`gpusession/server/`) serves every endpoint
 * below under `<base_url>/gpusession/api/`, as JSON, behind Jupyter's
 * authentication. Each type names the endpoint(s) that send or accept it; keep
 * this file and the server's serializers in step.
 */

/** Lifecycle of a session: requested -> provisioning -> starting -> running
 * -> stopping -> stopped, or `failed` (with `error`) from any earlier state. */
export type SessionState =
  | 'requested'
  | 'provisioning'
  | 'starting'
  | 'running'
  | 'stopping'
  | 'stopped'
  | 'failed';

/** Idle watchdog of a session, as decided on the remote side. */
export interface IdleView {
  /** Idle time after which the session stops itself, in seconds; null: never. */
  timeout_s: number | null;
  /** Seconds left before the idle stop; null when there is no timeout, or
   * when the server has no fresh word from the session's agent. */
  remaining_s: number | null;
  /** A warning to show the user (e.g. "stopping in 5 min"), or null. */
  warning: string | null;
}

/** Kinds of `StopReasonView`: gpusession/core/protocol.py `StopKind`, in its
 * order (tests/data/format_cases.json `stop_kinds` holds both to it). */
export const STOP_KINDS = [
  'idle',
  'max-runtime',
  'max-cost',
  'user',
  'gc',
  'signal',
  'kernel-exit',
  'start-failed',
  'spot-interruption',
  'instance-ended',
  'container-exit',
  'time-limit', // Slurm ended the job at its time limit (TIMEOUT, DEADLINE)
  'preempted', // Slurm took the allocation back for another job
  'job-ended', // Slurm ended the job for a reason it gives (NODE_FAIL, OUT_OF_MEMORY...)
  'gone'
] as const;

export type StopKind = (typeof STOP_KINDS)[number];

/** Why a session ended (`SessionView.stop_reason`); the numbers that go
 * with a kind are there only for it. */
export interface StopReasonView {
  kind: StopKind;
  /** The reason in words: "after 5s idle", "stopped by the JupyterLab sidebar". */
  text: string;
  /** Who stopped it (kinds `user` and `gc`). */
  by?: string;
  idle_for_s?: number;
  idle_timeout_s?: number;
  elapsed_s?: number;
  max_runtime_s?: number;
  spent?: number;
  max_cost?: number;
  signal?: number;
  exit_code?: number;
  detail?: string;
}

/**
 * One GPU session.
 *
 * Sent by: GET `sessions/<id>`, items of GET `sessions`, 202 reply of POST
 * `sessions`, reply of DELETE `sessions/<id>` and of POST
 * `sessions/<id>/keepalive`.
 */
export interface SessionView {
  id: string;
  name: string;
  /** Where the GPUs come from: "local", "docker", "aws", ... */
  backend: string;
  /** GPU type name as in the catalog, e.g. "T4". */
  gpu_type: string;
  gpu_count: number;
  state: SessionState;
  /** Unix seconds. */
  created_at: number;
  /** Unix seconds; null until running. */
  started_at: number | null;
  /** Unix seconds; null until stopped. */
  stopped_at: number | null;
  /** Seconds the session has been running (billed time). */
  uptime_s: number;
  /** US dollars per hour. */
  price_per_hour: number;
  /** US dollars spent so far. */
  cost_so_far: number;
  /** billed seconds so far (under 60: a minute's cost) */
  billed_s?: number;
  /** the minimum charge while it applies ('60-second minimum'), else null */
  cost_note?: string | null;
  spot: boolean;
  /** Docker host or instance address; null for local sessions. */
  host: string | null;
  /** The image it runs (or was asked to run); null when it runs none (local). */
  image: string | null;
  /** Ended without a billed resource (its start failed before one existed): it cost nothing. */
  never_ran: boolean;
  /** "ran 1m05s", or "never ran". */
  ran: string;
  /** What its price is where no cloud bills it: "cloud rate, own hardware",
   * "configured price"; null for a cloud's price. */
  price_note: string | null;
  /** Why the session failed; null otherwise. */
  error: string | null;
  /** A switch it took part in (as the old session or the new one) was cut by the
   * death of the process running it: what was left and what to do, one line;
   * the same on both cards. Null otherwise. */
  cut_switch_text: string | null;
  /** How it was placed, one line: the type a fallback list took and why the earlier
   * were passed over, the box of a pool and why, the GPUs of its box it holds
   * (words/status.py placement_line). Null when there is nothing to say. */
  placement?: string | null;
  idle: IdleView;
  /** Cost in US dollars at which the session stops itself; null: no cap. */
  max_cost: number | null;
  /** Why it ended; null while it is active (or when nobody knows). */
  stop_reason: StopReasonView | null;
  /** How it ended, one line for the history: "stopped by its idle watchdog
   * after 30m00s idle", "failed: connect: ..."; null while active. */
  ended: string | null;
  /** The workspace it uses (its files; Save and stop keeps its variables
   * there), or null when its backend keeps none. */
  workspace: string | null;
  /** A POST `sessions` body that starts the same kind of session again:
   * a fresh kernel on the same workspace. */
  restart: StartRequest;
  /** After a stop that saved the kernel's variables into the session's
   * workspace: `restart` plus `"resume": WORKSPACE`; else null. */
  resume: StartRequest | null;
  /** What an ended session's stop saved ("saved 2 variables, 1 kB; resume
   * with ..."), or why not; null when no save was tried. GET `sessions` only. */
  saved?: string | null;
  /** What a resumed session's kernel restored, one line each ("workspace
   * w1: restored 2 name(s) ...: a, b"); null otherwise. GET `sessions` only. */
  restored?: string | null;
  /** The latest lines of its start ("[   0.4s] provision: ..."), when this
   * server started it; else null. */
  progress: string[] | null;
  /** The Jupyter kernel (of a notebook or console) that started it, or null. */
  kernel_id: string | null;
  /** Every kernel of this server that uses it (its starter, a GPU kernel's
   * notebook, one that ran `%gpu use`), with when it took it up (unix s). */
  kernels?: Record<string, number>;
  /** While it runs and this month's spend passed 80% of the monthly budget
   * (level "warn") or all of it ("over"): the warning in words; else null. */
  budget_alert?: { level: string; text: string } | null;
}

/** Body of PUT `kernels/<kernel_id>/session`: connect a notebook (its
 * kernel) to a session; the reply is the session's `SessionView`, whose
 * `kernels` then holds the kernel. */
export interface ConnectRequest {
  /** The session's name (or id). */
  session: string;
}

/** Reply of POST `kernelspecs` (a `StartRequest` without `name`): the GPU
 * kernelspec installed for those options, the kernel a notebook changes to. */
export interface KernelspecReply {
  name: string;
  display_name: string;
}

/** Reply of POST `carry`: a private staging folder and the code the notebook's
 * current kernel runs to save its variables there (session/carry.py). */
export interface CarryStage {
  folder: string;
  code: string;
}

/** What the notebook's kernel printed after saving (its `GPUSESSION_CARRY` line). */
export interface CarrySaved {
  saved?: number;
  bytes?: number;
  skipped?: { name: string; why: string; type?: string }[];
  committed?: boolean;
  error?: string | null;
}

/** Reply of POST `sessions/<id>/carry`: what the GPU kernel restored. */
export interface CarryReply {
  restored: string[];
  imports: string[];
  failed: { name: string; why?: string; error?: string }[];
  skipped: { name: string; why: string; type?: string }[];
}

/** Reply of GET `sessions` (live sessions) and GET `sessions?history=N`
 * (live sessions and the N that ended last). */
export interface SessionListReply {
  sessions: SessionView[];
  /** The month's spend against the budget, from the one reading of the store
   * the cards' budget warnings use (null: no budget set). */
  budget?: BudgetView | null;
  /** "this month: $41.20 of the $50.00 monthly budget (82%)", or null. */
  budget_line?: string | null;
}

/** A process using a GPU, item of `GpuSample.processes`. */
export interface GpuProcess {
  pid: number;
  name: string | null;
  /** Bytes; null when NVML does not say. */
  memory_used: number | null;
}

/**
 * One GPU at one instant, item of `Sample.gpus` (GET `sessions/<id>/stats`).
 * A value the board does not report (NVML's NotSupported) is null; a GPU
 * NVML lost has every value null and says why in `error`.
 */
export interface GpuSample {
  index: number;
  name: string | null;
  uuid: string | null;
  /** Percent, 0-100. */
  utilization: number | null;
  /** Bytes. */
  memory_used: number | null;
  /** Bytes. */
  memory_total: number | null;
  /** Degrees Celsius. */
  temperature: number | null;
  /** Watts. */
  power_draw: number | null;
  /** Watts. */
  power_limit: number | null;
  /** MHz. */
  sm_clock: number | null;
  processes: GpuProcess[];
  /** A MIG slice the session was given: its profile ("1g.10gb"); NVML gives it no utilization. */
  mig?: string | null;
  /** Why NVML could not read this GPU at all: its kind, e.g. "GpuIsLost". */
  error?: string;
  /** The same in words (the server's): "the GPU is lost: the driver no longer sees it". */
  error_text?: string;
}

/** One sample of a session's machine, item of GET `sessions/<id>/stats`. */
export interface Sample {
  /** Unix seconds. */
  t: number;
  gpus: GpuSample[];
  /** Percent of all CPUs, or null when unknown. */
  cpu_percent: number | null;
  /** Bytes, or null when unknown. */
  memory_used: number | null;
  /** Bytes, or null when unknown. */
  memory_total: number | null;
  /** Whether the kernel was executing code. */
  kernel_busy: boolean;
}

/** The agent's idle watchdog, item of `StatsReply`. */
export interface StatsIdle {
  timeout_s: number | null;
  idle_for_s: number;
  /** Seconds left before the idle stop; null without a timeout. */
  remaining_s: number | null;
  /** Unix seconds until which a keep-alive holds the stop off, or null. */
  keepalive_until: number | null;
}

/** Reply of GET `sessions/<id>/stats?since=<unix seconds>`. */
export interface StatsReply {
  session_id: string;
  /** The agent's clock when it answered, unix seconds. */
  t: number;
  /** False when the agent sees no GPU (then `message` says why). */
  gpus_visible: boolean;
  /** Why there are no GPU stats (e.g. "no NVIDIA GPU visible"), or null. */
  message: string | null;
  /** Where the GPU values come from: "nvml" (the driver) or "recorded" (a
   * replay of values recorded from a driver, `--nvml-replay`). */
  source?: 'nvml' | 'recorded';
  /** A replay's recording: its GPU name and count, and whether it is of the
   * session's GPU type (false: recorded on another machine). */
  recording?: {
    gpu_name: string | null;
    gpu_count: number;
    of_this_type: boolean | null;
  } | null;
  /** Where replayed values come from, in words (null when live). */
  source_text?: string | null;
  /** Seconds between samples. */
  interval_s?: number;
  idle?: StatsIdle;
  /** Samples newer than `since`, oldest first. */
  samples: Sample[];
}

/**
 * Body of POST `sessions` (reply: 202 `SessionView`; 400 `ErrorReply` with
 * a message when an option is wrong) and of POST `options/check` (reply:
 * `OptionCheckReply`): option name (`OptionView.name`) -> value. Text fields
 * go as typed ("30m", "1h30m", "off", "$5"): the server parses them.
 */
export type StartRequest = Record<string, string | boolean>;

/** How a start option is typed, and so which control the form shows. */
export type OptionKind =
  | 'gpu_type'
  | 'backend'
  | 'duration'
  | 'money'
  | 'bool'
  | 'text'
  | 'choice'
  | 'gpus';

/** One option of starting a session, item of GET `options`. */
export interface OptionView {
  /** Key in `StartRequest`, e.g. "idle". */
  name: string;
  /** The same option on the command line and in `%gpu start`, e.g. "--idle". */
  flag: string;
  kind: OptionKind;
  /** Short caption, e.g. "Idle stop". */
  label: string;
  /** One sentence on what it does. */
  help: string;
  /** What the server uses when the option is left out, after the user's
   * Jupyter config (e.g. the configured default backend); null: none. */
  default: string | boolean | null;
  /** Backends the option applies to; null: every backend. */
  backends: string[] | null;
  /** Allowed values for `gpu_type` (catalog type names), `backend` (backend
   * names) and `choice`; null for the other kinds. */
  choices: string[] | null;
  /** Whether the sidebar's start form shows it. */
  form: boolean;
  /** What its empty field shows (both start forms): the value's shape,
   * unit and default, e.g. "90s, 15m, 1h30m, off · default 30m". */
  placeholder: string;
  /** The help under the field, in the user's words (no config names). */
  form_help?: string;
  /** A first start needs it: shown at once (the other fields fold under "More"). */
  first?: boolean;
}

/** An image a backend's machine already has, item of GET `images`. */
export interface LocalImageView {
  /** As the image option takes it: "repo:tag". */
  reference: string;
  /** Bytes; null when the engine does not say. */
  size_bytes: number | null;
  /** A session started from it here before (no probe at start). */
  runtime_cached: boolean;
  /** "python:3.12-slim · 45 MB · runtime cached" */
  text: string;
}

/** Reply of GET `images?backend=NAME&host=HOST`. */
export interface ImagesReply {
  backend: string;
  /** The image a start runs when none is named; null: none (the node's Python). */
  default: string | null;
  images: LocalImageView[];
}

/** Reply of GET `options`: every start option, in the order to show them. */
export interface OptionsReply {
  options: OptionView[];
  /** The metrics the charts draw (gpusession/configuration/metrics.py), in the order shown. */
  metrics: MetricView[];
  /** Per backend, the named places its --host field offers (a docker pool: `pool:lab`). */
  places?: Record<string, string[]>;
}

/**
 * One row of the metric table (gpusession/configuration/metrics.py `Metric`), item of
 * `OptionsReply.metrics` (GET `options`). The charts, sparklines and value
 * texts are made from these rows; `formatMetric` formats a value with one.
 */
export interface MetricView {
  /** Its field in the stats document: of a `GpuSample` ("gpu") or a `Sample` ("host"). */
  name: string;
  scope: 'gpu' | 'host';
  /** Short id: CSS classes ("gpusession-gpu-power") and a large chart's `data-metric`. */
  key: string;
  /** A large chart's caption: "Power". */
  label: string;
  /** A sparkline's caption: "Power". */
  short: string;
  /** What the number is shown in: "%", "W", "°C", "GiB". */
  unit: string;
  /** The field's value divided by this is the number in `unit`. */
  scale: number;
  /** Decimals shown. */
  digits: number;
  /** "number"; "bytes": below 1 GiB shown in MiB without decimals. */
  format: 'number' | 'bytes';
  /** The field of the same object it is drawn against ("power_limit"), or null. */
  limit: string | null;
  /** Without a limit: the top of its scale, grown in these steps to fit; or null. */
  top: number | null;
  /** Drawn as a chart; false: only the notebook's words show it. */
  charted: boolean;
}

/** Reply of POST `options/check`: option name -> what is wrong with its
 * value; empty when the body would start. */
export interface OptionCheckReply {
  errors: Record<string, string>;
}

/** Body of POST `sessions/<id>/keepalive` (reply: `SessionView`). */
/** Body of POST `sessions/<id>/switch`: the start options that change, and
 * `on_demand` (a spot session moves to on-demand capacity). */
export type SwitchRequest = Record<string, string | boolean>;

/** Reply of POST `sessions/<id>/switch`, once the new session runs. */
export interface SwitchReply {
  /** The new session. */
  session: SessionView;
  /** What moved and what did not (gpusession/session/switch.py `SwitchReport`). */
  report: Record<string, unknown>;
  /** The switch in one line: "switched t4-1 -> a100-1 in 14.2s: moved ...". */
  line: string;
}

export interface KeepAliveRequest {
  /** How long to keep the session alive, e.g. "1h". */
  duration: string;
}

/** An EC2 instance type offering a GPU type, item of `GpuTypeView.instance_types` (the aws
 * backend's column, gpusession/backends/aws/instances.py). */
export interface InstanceTypeView {
  name: string;
  gpu_count: number;
  /** US dollars per hour. */
  on_demand_per_hour: number;
  /** US dollars per hour, or null where spot is not offered. */
  spot_per_hour: number | null;
}

/** A GPU type, item of GET `catalog`. */
export interface GpuTypeView {
  name: string;
  memory_gb: number;
  /** The catalog's reference rate: US dollars per hour of one such GPU. */
  on_demand_per_hour: number;
  /** US dollars per GPU-hour, or null where spot is not offered; absent without the aws
   * backend (a backend's columns, `Backend.catalog_columns`). */
  spot_per_hour?: number | null;
  /** The aws backend's instances with the type; absent without it. */
  instance_types?: InstanceTypeView[];
}

/** Reply of GET `catalog`. */
/** GET `prices?type=...`: the current spot prices of a type per zone (aws), and the line the
 * start forms show for them (gpusession/words/spend.py `live_spot_line`). */
export interface PricesReply {
  type: string;
  rows: { zone: string | null; spot: number | null; on_demand: number; instance: string }[];
  line: string;
  prices_line: string;
}

export interface CatalogReply {
  types: GpuTypeView[];
  /** Date of the price snapshot, e.g. "2024-05-01". */
  snapshot_date: string;
  /** What every face says of it: "on-demand prices from the catalog of 2024-05-01". */
  prices_line: string;
  /** Region the prices are for, e.g. "us-east-1". */
  region: string;
  /** The backends that price GPUs themselves (a backend class's `price_list`): the
   * form shows the chosen backend's price of the chosen type over the catalog's. */
  backend_prices?: BackendPriceList[];
}

/** One backend's own prices (gpusession/configuration/registry.py `price_lists`). */
export interface BackendPriceList {
  backend: string;
  /** Where its prices come from, in words: "the demo price list". */
  source: string;
  /** US dollars per GPU-hour, by GPU type. */
  prices: Record<string, number>;
}

/**
 * One row of the spend report (gpusession/configuration/cost.py `spend_report`):
 * the sessions billed in the period under one key.
 *
 * Sent by: items of `ReportReply.rows`, its `total`, items of a row's `split`.
 */
export interface ReportRow {
  /** The GPU type, backend, UTC day ("2026-11-30") or workspace ("-": none). */
  key: string;
  sessions: number;
  /** US dollars billed in the period. */
  cost: number;
  gpu_hours: number;
  /** US dollars billed while the agent counted the GPU idle. */
  idle_cost: number;
  /** US dollars the right-sizing advice says a cheaper type would have saved. */
  could_save: number;
  /** Percent, weighted by GPU-hours; null when no session reported one. */
  mean_utilization: number | null;
  running: number;
  failed: number;
  /** Price source ("catalog", "paid", "configured", "free") -> sessions. */
  prices: Record<string, number>;
  /** The same in words: "2 catalog rate, 1 price paid" (rows only). */
  prices_text?: string;
  /** The row's parts by the second key (GET `report?split=type`). */
  split?: ReportRow[];
}

/** The month's spend against the monthly budget (cost.py `budget_status`). */
export interface BudgetView {
  budget: number;
  spent: number;
  /** spent / budget. */
  fraction: number;
  /** Unix seconds: the first second of the month (UTC). */
  month_start: number;
  state: 'ok' | 'warn' | 'over';
  /** Where the budget is set, in words. */
  source: string;
  /** The policy file when the budget is an administrator's monthly cap. */
  policy?: string;
}

/** Reply of GET `report?since=30d&by=type|backend|day|workspace[&split=type]`. */
export interface ReportReply {
  /** Unix seconds: the period. */
  since: number;
  until: number;
  by: string;
  rows: ReportRow[];
  total: ReportRow;
  prices: Record<string, number>;
  /** Which prices the numbers use, in words (what `gpusession report` prints). */
  prices_text: string;
  catalog_date: string;
  budget: BudgetView | null;
  /** "this month: $41.20 of the $50.00 monthly budget (82%)", or null. */
  budget_line: string | null;
  /** What `gpusession report` prints. */
  lines: string[];
}

/** Error body jupyter_server's APIHandler writes for any non-2xx reply. */
export interface ErrorReply {
  message?: string;
  reason?: string | null;
}

/**
 * A workspace that outlives its sessions (a Docker volume, a folder).
 *
 * Sent by: items of GET `workspaces`.
 */
export interface WorkspaceView {
  name: string;
  /** The backend that keeps it: "local", "docker". */
  backend: string;
  /** Where it lives, one line: a volume and its engine, a folder. */
  where: string;
  size_bytes: number | null;
  /** The size in words: "1.2 GB", "?" when unknown. */
  size: string;
  /** US dollars a month while kept; null: nothing billed. */
  monthly_cost: number | null;
  /** `monthly_cost` in words ("$0.80"), or null. */
  cost_per_month: string | null;
  /** Names of the recorded sessions that used it, newest first. */
  sessions: string[];
  /** Those still active. */
  active: string[];
  /** Whether a session uses it now (it cannot be deleted then). */
  in_use: boolean;
  /** Who uses it, in words: "w2 (active)", "none left", "in use". */
  used_by: string;
  /** The GPU type of the newest session that used it, or null. */
  last_type?: string | null;
  /** When that session last saved into it (unix seconds), or null. */
  saved_at?: number | null;
  /** Its line in the Resume pick list: "t4-3 · T4 on local · saved 5m ago · 1.0 kB". */
  pick_text?: string;
}

/** Reply of GET `workspaces`. */
export interface WorkspaceListReply {
  workspaces: WorkspaceView[];
  /** Backends that could not be asked, with why. */
  skipped: string[];
}

/** Reply of DELETE `workspaces/<name>?confirm=<name>`. */
export interface WorkspaceDeleteReply {
  deleted: string;
  backend: string;
  where: string;
}
