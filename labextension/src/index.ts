/**
 * gpusession JupyterLab extension: a left-sidebar panel of GPU sessions, a
 * status-bar item for the current notebook's session, a main-area view of a
 * session's history charts, and commands for all of them in the palette.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContext,
  Notification,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Toolbar } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { SessionAlerts } from './alerts';
import { errorMessage, GpuSessionClient } from './api';
import { CHARTS_ID, GpuChartsView } from './charts';
import { SessionListModel } from './model';
import { NotebookLinks, NotebookSessionBadge } from './notebooks';
import { GpuSessionPanel, PANEL_ID } from './panel';
import { isLive } from './sessions';
import { SPEND_ID, SpendSection, SpendView } from './spend';
import { askStop } from './stopdialog';
import { GpuStatusItem } from './statusbar';
import type { SessionView } from './types';

/** Command that opens the panel (also handy in browser tests). */
export const OPEN_COMMAND = 'gpusession:open-panel';
/** Opens the panel with the focus in its start form. */
export const START_COMMAND = 'gpusession:start';
/** Stops a session: `{id}`, else the current notebook's, else one to choose. */
export const STOP_COMMAND = 'gpusession:stop';
/** Opens the charts view: of `{id}`, else the current notebook's session. */
export const CHARTS_COMMAND = 'gpusession:open-charts';
/** Opens the Spend view (the spend report). */
export const SPEND_COMMAND = 'gpusession:open-spend';
/** Changes the current notebook's kernel to a GPU kernel (the start form's options). */
export const GPU_KERNEL_COMMAND = 'gpusession:run-notebook-on-gpu';
const CATEGORY = 'GPU Sessions';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpusession-labextension:plugin',
  description:
    'GPU sessions: sidebar with live GPU stats, cost and idle countdown; status-bar item; history charts.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null
  ) => {
    const client = new GpuSessionClient(app.serviceManager.serverSettings);
    const model = new SessionListModel(client);
    let charts: GpuChartsView | null = null;
    const openCharts = (id: string | null) => {
      if (!charts || charts.isDisposed) {
        charts = new GpuChartsView(model);
      }
      if (!charts.isAttached) {
        app.shell.add(charts, 'main');
      }
      app.shell.activateById(CHARTS_ID);
      charts.showSession(id);
    };
    const links = new NotebookLinks(
      model,
      app.serviceManager.sessions,
      app.serviceManager.kernelspecs,
      () => void app.commands.execute(START_COMMAND)
    );
    const panel = new GpuSessionPanel(model, id => openCharts(id), links);
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, PANEL_ID);
    void model.start();

    let spend: SpendView | null = null;
    const openSpend = () => {
      if (!spend || spend.isDisposed) {
        spend = new SpendView(client);
      }
      if (!spend.isAttached) {
        app.shell.add(spend, 'main');
      }
      app.shell.activateById(SPEND_ID);
      void spend.load();
    };
    const spendLine = new SpendSection(() => void app.commands.execute(SPEND_COMMAND));
    panel.node.querySelector('.gpusession-header')?.after(spendLine.node);
    const alerts = new SessionAlerts((kind, text) =>
      kind === 'warning'
        ? Notification.warning(text, { autoClose: false })
        : Notification.info(text, { autoClose: 10_000 })
    );
    model.changed.connect(() => {
      alerts.see(model.sessions);
      spendLine.show(model.budget, model.budgetLine);
    });

    const status = new GpuStatusItem(model, () => {
      void app.commands.execute(OPEN_COMMAND);
    });
    if (statusBar) {
      statusBar.registerStatusItem('gpusession-labextension:status', {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => status.isActive,
        activeStateChanged: status.activeChanged
      });
    }
    followKernel(app, labShell, context => {
      status.kernelId = context?.session?.kernel?.id ?? null;
      links.current = context;
    });
    // each notebook's toolbar: the session it uses (type, $/h, state), a click to change it
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: widget => {
        const context = sessionContextOf(widget);
        const toolbar = (widget as { toolbar?: Toolbar }).toolbar;
        if (!context || !toolbar) {
          return;
        }
        const badge = new NotebookSessionBadge(model, links, context);
        toolbar.insertItem(10, 'gpusession-session', badge);
        return badge;
      }
    });

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show GPU Sessions',
      caption: 'Open the GPU sessions sidebar',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(START_COMMAND, {
      label: 'Start a GPU Session…',
      caption: "Open the sidebar's start form",
      execute: () => {
        app.shell.activateById(PANEL_ID);
        panel.focusForm();
      }
    });
    app.commands.addCommand(STOP_COMMAND, {
      label: 'Stop a GPU Session…',
      caption: "Stop the current notebook's GPU session, or one you choose",
      execute: async args => {
        const id = typeof args.id === 'string' ? args.id : null;
        const asked = id ? model.sessions.find(s => s.id === id) : undefined;
        await stopSession(model, asked, status.session);
      }
    });
    app.commands.addCommand(CHARTS_COMMAND, {
      label: 'Open GPU Charts',
      caption: 'Large history charts of a GPU session',
      execute: args => openCharts(typeof args.id === 'string' ? args.id : (status.session?.id ?? null))
    });
    app.commands.addCommand(SPEND_COMMAND, {
      label: 'Open GPU Spend',
      caption: 'Where the GPU money went: by day, GPU type and workspace, against the budget',
      execute: openSpend
    });
    app.commands.addCommand(GPU_KERNEL_COMMAND, {
      label: 'Run this Notebook on a GPU…',
      caption: "Change this notebook's kernel to a GPU session, with the start form's options",
      isEnabled: () => links.current?.type === 'notebook' && !links.current.isDisposed,
      execute: async () => {
        if (links.current?.type === 'notebook') {
          await links.runOnGpu(links.current);
        }
      }
    });
    for (const command of [
      OPEN_COMMAND,
      START_COMMAND,
      STOP_COMMAND,
      CHARTS_COMMAND,
      SPEND_COMMAND,
      GPU_KERNEL_COMMAND
    ]) {
      palette?.addItem({ command, category: CATEGORY });
    }
  }
};

/**
 * Tell `setContext` the notebook or console last in focus, whenever it or
 * its kernel changes (it stays while the focus is on another kind of widget,
 * the charts say).
 */
function followKernel(
  app: JupyterFrontEnd,
  labShell: ILabShell | null,
  setContext: (context: ISessionContext | null) => void
): void {
  let context: ISessionContext | null = null;
  const watched = new WeakSet<ISessionContext>();
  const update = () => {
    if (context?.isDisposed) {
      context = null;
    }
    setContext(context);
  };
  const follow = () => {
    const found = sessionContextOf(app.shell.currentWidget);
    if (found) {
      context = found;
      if (!watched.has(found)) {
        watched.add(found);
        found.kernelChanged.connect(update);
        found.sessionChanged.connect(update);
        found.disposed.connect(update);
      }
    }
    update();
  };
  labShell?.currentChanged.connect(follow);
  void app.restored.then(follow);
}

/** A notebook's or console's session context; null for other widgets. */
function sessionContextOf(widget: Widget | null): ISessionContext | null {
  const candidate = (widget as { sessionContext?: unknown } | null)?.sessionContext;
  return candidate && typeof candidate === 'object' && 'kernelChanged' in candidate
    ? (candidate as ISessionContext)
    : null;
}

/**
 * Stop a session after asking how (Save and stop, Stop, Cancel): `session`
 * when given, else one of the live ones, `current` (the notebook's) named first.
 */
async function stopSession(
  model: SessionListModel,
  session: SessionView | undefined,
  current?: SessionView
): Promise<void> {
  const live = model.sessions.filter(isLive);
  const first = session && isLive(session) ? session : current && isLive(current) ? current : null;
  const rest = session && isLive(session) ? [] : live.filter(view => view !== first);
  const offered = first ? [first, ...rest] : rest;
  const [head, ...tail] = offered;
  if (!head) {
    Notification.info('No GPU session is running.', { autoClose: 4000 });
    return;
  }
  const { choice, session: chosen } = await askStop([head, ...tail]);
  if (choice === null) {
    return;
  }
  try {
    model.upsert(await model.client.stopSession(chosen.id, choice === 'save'));
    void model.refresh();
  } catch (error) {
    await showErrorMessage(`Cannot stop ${chosen.name}`, errorMessage(error));
  }
}

export default plugin;
