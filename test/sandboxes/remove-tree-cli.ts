// Runs removeTree on argv[2] in this process, so a test can run it as another uid (setpriv).
import { removeTree } from '../../src/sandboxes/remove-tree.js';

await removeTree(process.argv[2] ?? '');
