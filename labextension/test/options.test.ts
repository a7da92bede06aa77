import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  controlClass,
  controlKind,
  FieldValue,
  formOptions,
  initialValue,
  requestBody,
  selectChoices,
  selectedBackend,
  splitErrors,
  visibleOptions
} from '../src/options';
import type { OptionView } from '../src/types';
import { option } from './helpers';

/** An option table shaped like the server's. */
const OPTIONS: OptionView[] = [
  option({ name: 'type', kind: 'gpu_type', label: 'GPU type', choices: ['t4', 'a10g'] }),
  option({ name: 'backend', kind: 'backend', default: 'local', choices: ['local', 'docker', 'aws'] }),
  option({ name: 'host', kind: 'text', backends: ['docker'] }),
  option({ name: 'spot', kind: 'bool', default: false, backends: ['aws'] }),
  option({ name: 'idle', kind: 'duration', label: 'Idle stop', default: '30m' }),
  option({ name: 'max_cost', kind: 'money', label: 'Max cost' }),
  option({ name: 'gpus', kind: 'gpus', default: '1' }),
  option({ name: 'region', kind: 'choice', choices: ['us-east-1', 'eu-west-1'], backends: ['aws'] }),
  option({ name: 'name', kind: 'text' }),
  option({ name: 'gpu_only', kind: 'bool', label: 'GPU only', default: false, form: false })
];

const names = (options: readonly OptionView[]) => options.map(o => o.name);

function values(extra: Record<string, FieldValue> = {}): Map<string, FieldValue> {
  const map = new Map<string, FieldValue>();
  for (const o of formOptions(OPTIONS)) {
    map.set(o.name, initialValue(o));
  }
  for (const [key, value] of Object.entries(extra)) {
    map.set(key, value);
  }
  return map;
}

describe('fields', () => {
  test('only form options, in the served order', () => {
    assert.deepEqual(names(formOptions(OPTIONS)), [
      'type', 'backend', 'host', 'spot', 'idle', 'max_cost', 'gpus', 'region', 'name'
    ]);
  });

  test('a control by kind', () => {
    const kinds = Object.fromEntries(OPTIONS.map(o => [o.name, controlKind(o)]));
    assert.deepEqual(kinds, {
      type: 'select',
      backend: 'select',
      host: 'text',
      spot: 'checkbox',
      idle: 'text',
      max_cost: 'text',
      gpus: 'text',
      region: 'select',
      name: 'text',
      gpu_only: 'checkbox'
    });
  });

  test('class names the browser tests use', () => {
    assert.deepEqual(
      OPTIONS.slice(0, 6).map(controlClass),
      [
        'gpusession-type-select',
        'gpusession-backend-select',
        'gpusession-host-input',
        'gpusession-spot-input',
        'gpusession-idle-input',
        'gpusession-max-cost-input'
      ]
    );
  });

  test('initial values are the served defaults', () => {
    assert.deepEqual(Object.fromEntries(values()), {
      type: 't4', // no default: the first choice, as a select shows it
      backend: 'local',
      host: '',
      spot: false,
      idle: '30m',
      max_cost: '',
      gpus: '1',
      region: '', // a free choice without default may stay empty
      name: ''
    });
    assert.equal(initialValue(option({ name: 'x', kind: 'bool', default: true })), true);
    assert.equal(initialValue(option({ name: 'x', kind: 'text', default: true })), 'true');
  });

  test('select choices', () => {
    assert.deepEqual(selectChoices(OPTIONS[7]!), ['', 'us-east-1', 'eu-west-1']);
    assert.deepEqual(selectChoices(OPTIONS[1]!), ['local', 'docker', 'aws']);
    const configured = option({ name: 'type', kind: 'gpu_type', default: 'a100:8', choices: ['t4', 'a100'] });
    assert.deepEqual(selectChoices(configured), ['a100:8', 't4', 'a100']);
    assert.equal(initialValue(configured), 'a100:8');
  });
});

describe('backend-specific options', () => {
  test('shown only with their backend', () => {
    assert.deepEqual(names(visibleOptions(OPTIONS, values())), [
      'type', 'backend', 'idle', 'max_cost', 'gpus', 'name'
    ]);
    assert.deepEqual(names(visibleOptions(OPTIONS, values({ backend: 'docker' }))), [
      'type', 'backend', 'host', 'idle', 'max_cost', 'gpus', 'name'
    ]);
    assert.deepEqual(names(visibleOptions(OPTIONS, values({ backend: 'aws' }))), [
      'type', 'backend', 'spot', 'idle', 'max_cost', 'gpus', 'region', 'name'
    ]);
  });

  test('all shown when no option picks a backend', () => {
    const noBackend = OPTIONS.filter(o => o.kind !== 'backend');
    assert.equal(selectedBackend(noBackend, values()), null);
    assert.ok(names(visibleOptions(noBackend, values())).includes('host'));
  });
});

describe('request body', () => {
  test('defaults as served, empty text left out', () => {
    assert.deepEqual(requestBody(OPTIONS, values()), {
      type: 't4',
      backend: 'local',
      idle: '30m',
      gpus: '1'
    });
  });

  test('text as typed (the server parses it), trimmed; hidden fields left out', () => {
    const body = requestBody(
      OPTIONS,
      values({
        backend: 'aws',
        host: 'ssh://box', // docker only
        spot: true,
        idle: ' 1h30m ',
        max_cost: '$5',
        region: 'eu-west-1',
        name: 'exp'
      })
    );
    assert.deepEqual(body, {
      type: 't4',
      backend: 'aws',
      spot: true,
      idle: '1h30m',
      max_cost: '$5',
      gpus: '1',
      region: 'eu-west-1',
      name: 'exp'
    });
  });

  test('"off" goes to the server, which accepts it', () => {
    assert.equal(requestBody(OPTIONS, values({ idle: 'off' })).idle, 'off');
  });

  test('an unchecked visible box says false', () => {
    assert.equal(requestBody(OPTIONS, values({ backend: 'aws' })).spot, false);
  });
});

test('check errors: on their field when shown, else as labelled lines', () => {
  const shown = visibleOptions(OPTIONS, values());
  const { fields, other } = splitErrors(
    { idle: 'bad idle', spot: 'no spot here', gpu_only: 'nope', mystery: 'what' },
    shown,
    OPTIONS
  );
  assert.deepEqual(Object.fromEntries(fields), { idle: 'bad idle' });
  assert.deepEqual(other, ['spot: no spot here', 'GPU only: nope', 'mystery: what']);
});
