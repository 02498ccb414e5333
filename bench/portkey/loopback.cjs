// Preloaded (node -r) into the Portkey gateway by ssegate's bench. The
// gateway listens on every interface and has no option for the host: make
// every listen that gives a port and no host bind 127.0.0.1 instead.
'use strict';
const net = require('node:net');

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const a = args[0];
  if (typeof a === 'number' || (typeof a === 'string' && /^\d+$/.test(a))) {
    if (args[1] === undefined || args[1] === null) {
      args[1] = '127.0.0.1';
    } else if (typeof args[1] === 'function') {
      args.splice(1, 0, '127.0.0.1');
    }
  } else if (a && typeof a === 'object' && a.path === undefined && !a.host) {
    args[0] = { ...a, host: '127.0.0.1' };
  }
  return listen.apply(this, args);
};
