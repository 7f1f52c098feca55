package stack

import (
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/jsii-runtime-go"
)

// observability defines the alarms and the dashboard.
func (s *Stack) observability(props Props, deployment *string) {
	o := &observer{s: s, deployment: deployment, topic: s.alarmTopic(props), five: awscdk.Duration_Minutes(jsii.Number(5))}
	o.capacityAlarm(props)
	o.reconcileAlarm(props)
	o.throttleAlarm()
	o.tombstoneAlarm(props)
	o.serverErrorAlarm(props)
	o.dashboard()
}

// observer builds the alarms and the dashboard of a stack.
type observer struct {
	s          *Stack
	deployment *string
	topic      awssns.ITopic
	five       awscdk.Duration
}

// emf is one of the broker's embedded metrics, for this deployment.
func (o *observer) emf(name, stat string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(MetricNamespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{DimensionDeployment: o.deployment},
		Statistic:     jsii.String(stat),
		Period:        o.five,
	})
}

// alarm adds an alarm that notifies the topic when it fires and clears.
func (o *observer) alarm(key, id string, p *awscloudwatch.AlarmProps) {
	a := awscloudwatch.NewAlarm(o.s.Stack, jsii.String(id), p)
	a.AddAlarmAction(awscloudwatchactions.NewSnsAction(o.topic))
	a.AddOkAction(awscloudwatchactions.NewSnsAction(o.topic))
	o.s.Alarms[key] = a
}

func (o *observer) capacityAlarm(props Props) {
	capacity := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("100 * used / limit"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"used":  o.emf(MetricCapacityUsed, "Maximum"),
			"limit": o.emf(MetricCapacityLimit, "Maximum"),
		},
		Label:  jsii.String("capacity used (%)"),
		Period: o.five,
	})
	o.alarm("capacity", "CapacitySaturationAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("Capacity slots in use at or above %d%% of the limit for 15 minutes: acquires wait or get 429.", props.CapacityAlarmPercent)),
		Metric:             capacity,
		Threshold:          jsii.Number(float64(props.CapacityAlarmPercent)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

func (o *observer) reconcileAlarm(props Props) {
	s := o.s
	// One period per scheduled pass (ReconcileSchedule). Every pass that
	// ends writes BudgetExhausted (0 or 1); a pass that crashes or times
	// out writes none, and neither does a schedule that stopped invoking:
	// a period without it counts as a failed pass (FILL), and a period
	// without any data breaches.
	reconcile := s.Functions["reconcile"]
	n := float64(props.ReconcileAlarmPasses)
	one := awscdk.Duration_Minutes(jsii.Number(1))
	failed := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(ReconcileFailedExpression),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"errors":    reconcile.MetricErrors(&awscloudwatch.MetricOptions{Period: one, Statistic: jsii.String("Sum")}),
			"exhausted": o.emf(MetricReconcileBudgetExhausted, "Sum"),
		},
		Label:  jsii.String("failed or budget-exhausted reconcile passes"),
		Period: one,
	})
	o.alarm("reconcile", "ReconcileFailingAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("%d consecutive reconcile passes (1 minute apart) failed or ran out of budget.", props.ReconcileAlarmPasses)),
		Metric:             failed,
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(n),
		DatapointsToAlarm:  jsii.Number(n),
		TreatMissingData:   awscloudwatch.TreatMissingData_BREACHING,
	})
}

func (o *observer) throttleAlarm() {
	s := o.s
	throttleMetrics := map[string]awscloudwatch.IMetric{}
	var sum []string
	for _, f := range Functions {
		throttleMetrics[f.Name] = s.Functions[f.Name].MetricThrottles(&awscloudwatch.MetricOptions{Period: o.five, Statistic: jsii.String("Sum")})
		sum = append(sum, "FILL("+f.Name+", 0)")
	}
	o.alarm("throttles", "FunctionThrottlesAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("Lambda throttled invocations of the broker's functions in two consecutive 5-minute periods " +
			"(callers see 429/500, reconcile passes are skipped): raise the reserved concurrency or the account quota."),
		Metric: awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression:   jsii.String(strings.Join(sum, " + ")),
			UsingMetrics: &throttleMetrics,
			Label:        jsii.String("throttled invocations"),
			Period:       o.five,
		}),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(2),
		DatapointsToAlarm:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

func (o *observer) tombstoneAlarm(props Props) {
	o.alarm("tombstones", "TombstoneAgeAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("A sandbox kill has been unconfirmed for more than %d seconds (a tombstone holds a slot).", props.TombstoneAlarmSeconds)),
		Metric:             o.emf(MetricTombstoneOldestAge, "Maximum"),
		Threshold:          jsii.Number(float64(props.TombstoneAlarmSeconds)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

func (o *observer) serverErrorAlarm(props Props) {
	s := o.s
	rate := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("IF(requests > 0, 100 * errors / requests, 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"errors":   s.API.MetricServerError(&awscloudwatch.MetricOptions{Period: o.five, Statistic: jsii.String("Sum")}),
			"requests": s.API.MetricCount(&awscloudwatch.MetricOptions{Period: o.five, Statistic: jsii.String("Sum")}),
		},
		Label:  jsii.String("5xx (%)"),
		Period: o.five,
	})
	o.alarm("5xx", "ServerErrorRateAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("More than %d%% of API requests answered 5xx for 15 minutes.", props.ServerErrorAlarmPercent)),
		Metric:             rate,
		Threshold:          jsii.Number(float64(props.ServerErrorAlarmPercent)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// dashboard shows the alarms' states and the metrics they read.
func (o *observer) dashboard() {
	s, st := o.s, o.s.Stack
	graph := func(title string, metrics ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &metrics, Width: jsii.Number(12), Height: jsii.Number(6),
		})
	}
	var invocations, errs, throttles []awscloudwatch.IMetric
	for _, f := range Functions {
		fn := s.Functions[f.Name]
		lbl := &awscloudwatch.MetricOptions{Label: jsii.String(f.Name), Period: o.five}
		invocations = append(invocations, fn.MetricInvocations(lbl))
		errs = append(errs, fn.MetricErrors(lbl))
		throttles = append(throttles, fn.MetricThrottles(lbl))
	}
	alarmNames := make([]string, 0, len(s.Alarms))
	for k := range s.Alarms {
		alarmNames = append(alarmNames, k)
	}
	sort.Strings(alarmNames)
	var alarms []interfacesawscloudwatch.IAlarmRef
	for _, k := range alarmNames {
		alarms = append(alarms, s.Alarms[k])
	}
	awscloudwatch.NewDashboard(st, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		Widgets: &[]*[]awscloudwatch.IWidget{
			{awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
				Title: jsii.String("Alarms"), Alarms: &alarms, Width: jsii.Number(24),
			})},
			{
				graph("Capacity (slots)", o.emf(MetricCapacityUsed, "Maximum"), o.emf(MetricCapacityLimit, "Maximum")),
				graph("Capacity refusals (429)", o.emf(MetricCapacityRejected, "Sum")),
			},
			{
				graph("Reconcile passes", o.emf(MetricReconcileBudgetExhausted, "Sum"), o.emf(MetricReconcileErrors, "Sum"),
					o.emf(MetricReconcileKilled, "Sum"), o.emf(MetricReconcileExpired, "Sum")),
				graph("Oldest tombstone (s)", o.emf(MetricTombstoneOldestAge, "Maximum")),
			},
			{
				graph("Output sync: deferred files", o.emf(MetricSyncDeferred, "Sum")),
			},
			{
				graph("API requests and 5xx", s.API.MetricCount(&awscloudwatch.MetricOptions{Period: o.five}), s.API.MetricServerError(&awscloudwatch.MetricOptions{Period: o.five})),
				graph("Function invocations", invocations...),
			},
			{
				graph("Function errors", errs...),
				graph("Function throttles", throttles...),
			},
		},
	})
}

// ReconcileFailedExpression counts a 5-minute period as failed when the
// reconcile function reported errors, or a pass ran out of budget, or no
// pass reported at all (crash, timeout, not invoked).
const ReconcileFailedExpression = "FILL(errors, 0) + FILL(exhausted, 1)"

// alarmTopic is the topic every alarm notifies: props.AlarmTopicARN, or a
// topic of the stack (TLS only, CloudWatch allowed to publish) with an
// e-mail subscription when the AlarmEmail parameter is set.
func (s *Stack) alarmTopic(props Props) awssns.ITopic {
	st := s.Stack
	if props.AlarmTopicARN != "" {
		s.AlarmTopic = awssns.Topic_FromTopicArn(st, jsii.String("AlarmTopic"), jsii.String(props.AlarmTopicARN))
		return s.AlarmTopic
	}
	topic := awssns.NewTopic(st, jsii.String("AlarmTopic"), &awssns.TopicProps{
		DisplayName: jsii.String("sandbox-broker alarms"),
		EnforceSSL:  jsii.Bool(true),
	})
	// The topic policy CDK writes for EnforceSSL replaces SNS's default
	// one: CloudWatch alarms of this account must be allowed explicitly.
	topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("AllowCloudWatchAlarms"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  jsii.Strings(*topic.TopicArn()),
		Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
	}))
	email := awscdk.NewCfnParameter(st, jsii.String(ParamAlarmEmail), &awscdk.CfnParameterProps{
		Type:           jsii.String("String"),
		Default:        jsii.String(""),
		AllowedPattern: jsii.String(`^([^\s@]+@[^\s@]+)?$`),
		Description:    jsii.String("E-mail address subscribed to the alarm topic (empty = none; confirm the subscription from the e-mail AWS sends)."),
	})
	s.Params[ParamAlarmEmail] = email
	hasEmail := awscdk.NewCfnCondition(st, jsii.String("HasAlarmEmail"), &awscdk.CfnConditionProps{
		Expression: awscdk.Fn_ConditionNot(awscdk.Fn_ConditionEquals(email.ValueAsString(), jsii.String(""))),
	})
	sub := awssns.NewCfnSubscription(st, jsii.String("AlarmEmailSubscription"), &awssns.CfnSubscriptionProps{
		TopicArn: topic.TopicArn(),
		Protocol: jsii.String("email"),
		Endpoint: email.ValueAsString(),
	})
	sub.CfnOptions().SetCondition(hasEmail)
	s.AlarmTopic = topic
	return topic
}
