import assert from 'node:assert/strict';
import { test } from 'node:test';

import { checkSettings, errorMessage, settingsOk } from '../src/index.js';
import { ComponentError, validate } from '../src/testing/index.js';

test('an Error thrown while checking settings becomes the WIT error string', () => {
  const validateSettings = (settings: string) =>
    checkSettings(() => {
      if (settings !== 'null') throw new Error(`unexpected settings ${settings}`);
      return settingsOk();
    });
  assert.deepEqual(validate(validateSettings, null), { tag: 'ok', val: settingsOk() });
  assert.deepEqual(validate(validateSettings, { a: 1 }), { tag: 'err', val: 'unexpected settings {"a":1}' });
});

test('validate refuses an exception that would trap in slotgate', () => {
  const traps = () => {
    throw new Error('not a string');
  };
  assert.throws(() => validate(traps, null), /only a string becomes the WIT error/);
});

test('errorMessage reads WIT errors, Errors and anything else', () => {
  assert.equal(errorMessage(new ComponentError('bad period')), 'bad period');
  assert.equal(errorMessage({ payload: 'from a component' }), 'from a component');
  assert.equal(errorMessage(new TypeError('x is undefined')), 'x is undefined');
  assert.equal(errorMessage('plain'), 'plain');
  assert.equal(errorMessage(42), '42');
});
