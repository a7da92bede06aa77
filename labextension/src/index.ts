/**
 * gpusession JupyterLab extension: a left-sidebar panel of GPU sessions.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';

import { GpuSessionClient } from './api';
import { GpuSessionPanel, PANEL_ID } from './panel';

/** Command that opens the panel (also handy in browser tests). */
export const OPEN_COMMAND = 'gpusession:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpusession-labextension:plugin',
  description: 'Sidebar panel with live GPU stats, cost and idle countdown of gpusession sessions.',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    const client = new GpuSessionClient(app.serviceManager.serverSettings);
    const panel = new GpuSessionPanel(client);
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, PANEL_ID);
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show GPU sessions',
      execute: () => app.shell.activateById(PANEL_ID)
    });
  }
};

export default plugin;
