import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { windowText } from '../src/bigchart';
import {
  appendSamples,
  areaPoints,
  chartSpan,
  chartedMetrics,
  fieldPoints,
  gpuFrame,
  gpuSeries,
  gpuTitle,
  hostSeries,
  lastKnown,
  metricCharts,
  MIG_UTILIZATION,
  polylinePoints,
  scaleTop,
  STATS_WINDOW_S
} from '../src/series';
import type { MetricView } from '../src/types';
import { formatCases, gpu, sample } from './helpers';

const METRICS = formatCases().metrics.table;

const times = (samples: readonly { t: number }[]) => samples.map(s => s.t);

describe('appendSamples', () => {
  test('appends only samples newer than the last one', () => {
    const current = [sample(10), sample(11)];
    const merged = appendSamples(current, [sample(10), sample(11), sample(12), sample(13)]);
    assert.deepEqual(times(merged), [10, 11, 12, 13]);
  });

  test('keeps the same array when nothing is new (no re-render)', () => {
    const current = [sample(10), sample(11)];
    assert.equal(appendSamples(current, [sample(9), sample(11)]), current);
    assert.equal(appendSamples(current, []), current);
  });

  test('starts from nothing', () => {
    assert.deepEqual(times(appendSamples([], [sample(1), sample(2)])), [1, 2]);
  });

  test('drops what falls out of the window, measured from the newest sample', () => {
    const current = [sample(0), sample(100), sample(200)];
    const merged = appendSamples(current, [sample(350)], 300);
    assert.deepEqual(times(merged), [100, 200, 350]);
  });

  test('a server clock far from the browser clock does not empty it', () => {
    const old = 1_000; // unix seconds long ago
    const merged = appendSamples([], [sample(old), sample(old + 1)]);
    assert.deepEqual(times(merged), [old, old + 1]);
  });

  test('the default window is STATS_WINDOW_S', () => {
    const merged = appendSamples([sample(0)], [sample(STATS_WINDOW_S + 1)]);
    assert.deepEqual(times(merged), [STATS_WINDOW_S + 1]);
  });
});

test('gpuSeries picks one GPU by index and skips samples without it', () => {
  const samples = [
    sample(1, [gpu(0, 10), gpu(1, 90)]),
    sample(2, [gpu(0, 20)]),
    sample(3, [gpu(1, 70), gpu(0, 30)])
  ];
  const one = gpuSeries(samples, 1);
  assert.deepEqual(
    one.map(({ t, gpu: g }) => [t, g.utilization]),
    [
      [1, 90],
      [3, 70]
    ]
  );
  assert.deepEqual(gpuSeries(samples, 7), []);
});

describe('polylinePoints', () => {
  const base = { tEnd: 100, windowS: 100, max: 100, valueText: '', value: null };

  test('maps time to x and value to y in the 100 x 30 view box', () => {
    const points = [
      { t: 0, v: 0 },
      { t: 50, v: 50 },
      { t: 100, v: 100 }
    ];
    assert.equal(polylinePoints({ ...base, points }), '0.0,30.0 50.0,15.0 100.0,0.0');
  });

  test('clips values to [0, max] and skips old or non-finite points', () => {
    const points = [
      { t: -1, v: 10 },
      { t: 10, v: 150 },
      { t: 20, v: -5 },
      { t: 30, v: Number.NaN }
    ];
    assert.equal(polylinePoints({ ...base, points }), '10.0,0.0 20.0,30.0');
  });

  test('a max of 0 (e.g. no power limit known) does not divide by zero', () => {
    assert.equal(polylinePoints({ ...base, max: 0, points: [{ t: 100, v: 0 }] }), '100.0,30.0');
  });
});

describe('large charts', () => {
  test('points in a chart of its own size', () => {
    const data = { points: [{ t: 0, v: 0 }, { t: 300, v: 50 }], tEnd: 300, windowS: 300, max: 100, valueText: '', value: 50 };
    assert.equal(polylinePoints(data, 600, 150), '0.0,150.0 600.0,75.0');
  });

  test('the area under the line, closed along the bottom', () => {
    assert.equal(areaPoints('0.0,150.0 600.0,75.0', 150), '0.0,150 0.0,150.0 600.0,75.0 600.0,150');
    assert.equal(areaPoints('10.0,5.0', 150), '');
    assert.equal(areaPoints('', 150), '');
  });

  test('CPU scale: one core, or whole cores above', () => {
    assert.equal(scaleTop(100, []), 100);
    assert.equal(scaleTop(100, [3, 99.9]), 100);
    assert.equal(scaleTop(100, [150]), 200);
  });

  test('time axis', () => {
    assert.equal(windowText(300), '5m');
    assert.equal(windowText(900), '15m');
    assert.equal(windowText(3600), '1h');
  });
});

describe('GPU titles', () => {
  test('the name, and why a GPU could not be read, after the name it had', () => {
    // the agent sends NVML's kind; the server adds it in words (gpusession.configuration.metrics.nvml_error_text)
    const words = 'the GPU is lost: the driver no longer sees it';
    const lost = { ...gpu(1, 0), name: null, error: 'GpuIsLost', error_text: words };
    assert.equal(gpuTitle([{ gpu: gpu(0, 5) }]), 'GPU 0 · Tesla T4');
    assert.equal(gpuTitle([{ gpu: gpu(1, 5) }, { gpu: lost }]), `GPU 1 · Tesla T4 · ${words}`);
    assert.equal(gpuTitle([{ gpu: lost }]), `GPU 1 · unknown · ${words}`);
    assert.equal(gpuTitle([]), '');
  });

  test('points leave out what the board does not report', () => {
    const series = [
      { t: 1, item: gpu(0, 10) },
      { t: 2, item: { ...gpu(0, 0), utilization: null } },
      { t: 3, item: gpu(0, 30) }
    ];
    assert.deepEqual(fieldPoints(series, 'utilization'), [{ t: 1, v: 10 }, { t: 3, v: 30 }]);
  });

  test('a young session fills the chart: at least a minute, at most the window', () => {
    assert.equal(chartSpan([sample(0), sample(10)], 300), 60);
    assert.equal(chartSpan([sample(0), sample(120)], 300), 120);
    assert.equal(chartSpan([sample(0), sample(1000)], 300), 300);
    assert.equal(chartSpan([], 300), 300);
  });
});

describe('scales', () => {
  test("a scale's top is the latest value reported, past a reading without it", () => {
    const lost = { ...gpu(1, 0), memory_total: null, power_limit: null };
    const series = [{ item: gpu(1, 5) }, { item: lost }];
    assert.equal(lastKnown(series, 'memory_total'), 16 * 2 ** 30);
    assert.equal(lastKnown(series, 'power_limit'), 70);
    assert.equal(lastKnown([{ item: lost }], 'power_limit'), null);
  });
});

describe('gpuFrame and metricCharts', () => {
  test('is null before a GPU has a sample', () => {
    assert.equal(gpuFrame([sample(1)], 3), null);
  });

  test('one chart per drawn row of the served table, with its scale and text', () => {
    const samples = [sample(1, [gpu(0, 10), gpu(1, 50)]), sample(2, [gpu(0, 20), gpu(1, 60)])];
    const frame = gpuFrame(samples, 1)!;
    assert.equal(frame.title, 'GPU 1 · Tesla T4');
    const charts = metricCharts(frame.series, chartedMetrics(METRICS, 'gpu'), 300);
    assert.deepEqual(
      charts.map(c => [c.metric.key, c.data.valueText, c.topText, c.data.max]),
      [
        ['util', '60%', '100%', 100],
        ['memory', '1.0/16.0 GiB', '16.0 GiB', 16 * 2 ** 30],
        ['temp', '50 °C', '100 °C', 100],
        ['power', '30/70 W', '70 W', 70]
      ]
    );
    assert.deepEqual(charts[0]!.data.points, [
      { t: 1, v: 50 },
      { t: 2, v: 60 }
    ]);
    assert.equal(charts[0]!.data.tEnd, 2);
  });

  test("a MIG slice's utilization says n/a (MIG), its memory as any GPU's", () => {
    const slice = { ...gpu(0, 0), utilization: null, mig: '1g.10gb', memory_total: 10 * 2 ** 30 };
    const charts = metricCharts(gpuFrame([sample(1, [slice])], 0)!.series, chartedMetrics(METRICS, 'gpu'), 300);
    assert.equal(charts[0]!.data.valueText, MIG_UTILIZATION);
    assert.equal(charts[1]!.data.valueText, '1.0/10.0 GiB');
    // a whole GPU that reports none is plain n/a
    const none = { ...gpu(0, 0), utilization: null };
    assert.equal(metricCharts(gpuFrame([sample(1, [none])], 0)!.series, METRICS, 300)[0]!.data.valueText, 'n/a');
  });

  test("the session's processes: CPU grows by cores, memory against its total", () => {
    const samples = [{ ...sample(1), cpu_percent: 150, memory_used: 76 * 2 ** 20, memory_total: 2 ** 31 }];
    const charts = metricCharts(hostSeries(samples), chartedMetrics(METRICS, 'host'), 300);
    assert.deepEqual(
      charts.map(c => [c.metric.key, c.data.valueText, c.topText]),
      [
        ['cpu', '150%', '200%'],
        ['ram', '76 MiB/2.0 GiB', '2.0 GiB']
      ]
    );
  });

  test('a row added to the table is drawn with no other change', () => {
    const fan: MetricView = {
      name: 'fan_speed', scope: 'gpu', key: 'fan', label: 'Fan', short: 'Fan', unit: '%',
      scale: 1, digits: 0, format: 'number', limit: null, top: 100, charted: true
    };
    const withFan = { ...gpu(0, 5), fan_speed: 41.6 };
    const charts = metricCharts(gpuFrame([sample(1, [withFan])], 0)!.series, [...METRICS, fan], 300);
    const drawn = charts.find(c => c.metric.key === 'fan')!;
    assert.equal(drawn.data.valueText, '42%');
    assert.deepEqual(drawn.data.points, [{ t: 1, v: 41.6 }]);
  });
});
