//! The `consistd` binary: parse flags, load config (exit 64 when invalid), set up logs, run.

use std::process::ExitCode;

use clap::Parser;
use consistd::cli::{self, Cli, Command, ConfigCommand};
use consistd_core::config::Environment;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = Environment::of_process();
    match cli.command {
        Command::Config(ConfigCommand::Check { file, pod }) => cli::config_check(&file, pod, env),
        Command::Status(args) => runtime().block_on(cli::status(&args)),
        Command::Inject(args) => match (&args.command, &args.file) {
            (Some(cli::InjectCommand::Webhook(webhook)), _) => {
                let runtime = runtime();
                let telemetry = {
                    let _entered = runtime.enter();
                    consistd_observe::telemetry::init(consistd_core::config::LogFormat::Json, &webhook.log_level, &env)
                };
                let code = runtime.block_on(cli::inject_webhook(webhook));
                telemetry.shutdown();
                code
            }
            (None, Some(file)) => consistd_core::inject::flags::inject_file(file, &args.defaults),
            // clap requires -f when no subcommand is given.
            (None, None) => ExitCode::from(2),
        },
        Command::Run(args) => {
            let config = match args.load_config(&env) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("consistd: invalid configuration: {}", consistd_core::error::chain(&error));
                    return ExitCode::from(cli::EXIT_INVALID_CONFIG);
                }
            };
            let runtime = runtime();
            let telemetry = {
                let _entered = runtime.enter();
                consistd_observe::telemetry::init(config.log.format, &config.log.level, &env)
            };
            let log = telemetry.log.clone();
            let source = consistd::reload::ConfigSource { file: args.config.clone(), overrides: args.overrides(), log };
            let code = match runtime.block_on(consistd::run::run(config, &env, source)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(error = %consistd_core::error::chain(&error), "consistd failed");
                    ExitCode::FAILURE
                }
            };
            // The runtime's workers still run: the exporter sends what is buffered.
            telemetry.shutdown();
            code
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|error| panic!("start the tokio runtime: {error}"))
}
