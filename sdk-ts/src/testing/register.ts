/**
 * `node --import <this file, compiled> --test ...`: installs the hook that resolves the WIT's
 * imports to the fake host, before any test file (and so any policy) is loaded.
 */

import { register } from 'node:module';

register('./hooks.js', import.meta.url);
