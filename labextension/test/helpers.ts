/**
 * Builders of wire objects for the tests, and the shared format cases.
 */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

import type { GpuSample, MetricView, OptionView, Sample, SessionView } from '../src/types';

/** tests/data/format_cases.json: inputs and what gpusession.core.durations prints for them. */
export interface FormatCases {
  duration: [number | null, string][];
  money: [number, string][];
  /** gpusession.core.protocol.StopKind's values, in order. */
  stop_kinds: string[];
  /** gpusession.configuration.metrics: the table as GET options serves it, and [key, value, limit, text]. */
  metrics: { table: MetricView[]; cases: [string, number | null, number | null, string][] };
}

/** Read tests/data/format_cases.json of the repository (found upwards from here). */
export function formatCases(): FormatCases {
  let dir = __dirname;
  for (;;) {
    const candidate = join(dir, 'tests', 'data', 'format_cases.json');
    if (existsSync(candidate)) {
      return JSON.parse(readFileSync(candidate, 'utf8')) as FormatCases;
    }
    const parent = dirname(dir);
    if (parent === dir) {
      throw new Error(`no tests/data/format_cases.json above ${__dirname}`);
    }
    dir = parent;
  }
}

export function session(fields: Partial<SessionView> = {}): SessionView {
  return {
    id: 'id0',
    name: 'one',
    backend: 'local',
    gpu_type: 't4',
    gpu_count: 1,
    state: 'running',
    created_at: 1000,
    started_at: 1001,
    stopped_at: null,
    uptime_s: 108,
    price_per_hour: 0.526,
    cost_so_far: 0.0158,
    spot: false,
    host: null,
    image: null,
    never_ran: false,
    ran: 'ran 30s',
    price_note: null,
    error: null,
    cut_switch_text: null,
    idle: { timeout_s: 1800, remaining_s: 1799.6, warning: null },
    max_cost: null,
    stop_reason: null,
    ended: null,
    workspace: null,
    restart: { type: 't4', backend: 'local', idle: '1800s' },
    resume: null,
    progress: null,
    kernel_id: null,
    ...fields
  };
}

export function gpu(index: number, utilization: number): GpuSample {
  return {
    index,
    name: 'Tesla T4',
    uuid: `GPU-${index}`,
    utilization,
    memory_used: 2 ** 30,
    memory_total: 16 * 2 ** 30,
    temperature: 50,
    power_draw: 30,
    power_limit: 70,
    sm_clock: 1590,
    processes: []
  };
}

export function sample(t: number, gpus: GpuSample[] = [gpu(0, t)]): Sample {
  return {
    t,
    gpus,
    cpu_percent: 10,
    memory_used: 1,
    memory_total: 2,
    kernel_busy: false
  };
}

export function option(fields: Partial<OptionView> & Pick<OptionView, 'name' | 'kind'>): OptionView {
  return {
    flag: `--${fields.name.replace(/_/g, '-')}`,
    label: fields.name,
    help: '',
    default: null,
    backends: null,
    choices: null,
    form: true,
    placeholder: '',
    ...fields
  };
}
