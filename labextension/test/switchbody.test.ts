import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { currentValues, switchBody, switchWhere } from '../src/switchbody';
import type { OptionView } from '../src/types';
import { session } from './helpers';

function option(name: string, kind: OptionView['kind'], backends: string[] | null): OptionView {
  return {
    name,
    flag: `--${name}`,
    kind,
    label: name,
    help: '',
    default: null,
    backends,
    choices: null,
    form: true,
    placeholder: ''
  };
}

const OPTIONS = [
  option('type', 'gpu_type', null),
  option('backend', 'backend', null),
  option('spot', 'bool', ['aws']),
  option('image', 'text', ['docker', 'aws', 'slurm']),
  option('host', 'text', ['docker', 'slurm']),
  option('region', 'text', ['aws'])
];

describe('switchBody', () => {
  test('only what changed, for the chosen backend', () => {
    const view = session({ backend: 'docker', host: 'ssh://root@far', image: 'py:3', gpu_type: 't4' });
    const values = currentValues(view);
    assert.deepEqual(switchBody(OPTIONS, values, view), {});
    values.set('type', 'a100');
    values.set('region', 'eu-west-1'); // not a docker option: left out
    assert.deepEqual(switchBody(OPTIONS, values, view), { type: 'a100' });
    values.set('host', ' '); // back to this machine's engine
    assert.deepEqual(switchBody(OPTIONS, values, view), { type: 'a100', host: '' });
  });

  test('a spot session unticked is on_demand; two GPUs keep their count', () => {
    const view = session({ backend: 'aws', spot: true, gpu_type: 'a10g', gpu_count: 2 });
    const values = currentValues(view);
    assert.equal(values.get('type'), 'a10g:2');
    values.set('spot', false);
    assert.deepEqual(switchBody(OPTIONS, values, view), { on_demand: true });
    values.set('backend', 'docker');
    assert.deepEqual(switchBody(OPTIONS, values, view), { backend: 'docker' });
  });

  test('where a switch goes, in words, for its card until the first stage', () => {
    const view = session({ backend: 'aws', spot: true, gpu_type: 'a10g', gpu_count: 2 });
    assert.equal(switchWhere(view, { on_demand: true }), 'a10g:2 on aws (on demand)');
    assert.equal(switchWhere(view, { type: 'a100', backend: 'local' }), 'a100 on local');
  });
});
